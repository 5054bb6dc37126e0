//! Runs the `rbac-rules` binary for the CLI suites: exit code, stdout and
//! stderr, written once.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

/// What a run of the binary left: exit code (None: killed by a signal),
/// stdout and stderr.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn of(out: std::process::Output) -> Run {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// (exit code, stdout, stderr).
    pub fn parts(self) -> (Option<i32>, String, String) {
        (self.code, self.stdout, self.stderr)
    }
}

/// The crate's root: paths in the suites are relative to it.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `rbac-rules` binary, run in the crate's root; stdin empty.
pub fn rbac_rules() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rbac-rules"));
    cmd.current_dir(root()).stdin(Stdio::null());
    cmd
}

/// [`rbac_rules`] with `args`.
pub fn command<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Command {
    let mut cmd = rbac_rules();
    cmd.args(args);
    cmd
}

/// Runs `cmd` to its end.
pub fn output(cmd: &mut Command) -> Run {
    Run::of(cmd.output().expect("run rbac-rules"))
}

/// Runs `cmd` with `stdin` written to its standard input.
pub fn output_with_stdin(cmd: &mut Command, stdin: &str) -> Run {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rbac-rules");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    Run::of(child.wait_with_output().expect("wait for rbac-rules"))
}

/// `rbac-rules ARGS` in `dir`: exit code, stdout, stderr.
pub fn run_in(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    output(command(args).current_dir(dir)).parts()
}

/// `rbac-rules ARGS` in the crate's root (paths relative to it).
pub fn run(args: &[&str]) -> (Option<i32>, String, String) {
    output(&mut command(args)).parts()
}

/// `rbac-rules render --rules RULES --objects OBJECTS EXTRA`.
pub fn render_files(rules: &Path, objects: &Path, extra: &[&str]) -> Run {
    let mut cmd = command(["render"]);
    cmd.arg("--rules")
        .arg(rules)
        .arg("--objects")
        .arg(objects)
        .args(extra);
    output(&mut cmd)
}

/// `render` of rule and object YAML texts, written to a temporary
/// directory as `rules.yaml` and `objects.yaml`.
pub fn render(rules: &str, objects: &str, extra: &[&str]) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules_path = dir.path().join("rules.yaml");
    let objects_path = dir.path().join("objects.yaml");
    std::fs::write(&rules_path, rules).expect("write rules");
    std::fs::write(&objects_path, objects).expect("write objects");
    render_files(&rules_path, &objects_path, extra)
}
