//! The process's allocator settings for a long-running controller.

/// Caps glibc's malloc arenas at two. By default glibc gives each thread
/// that meets contention its own arena (up to eight per core), and memory
/// freed in one arena is not reused by another: at the bench's `large`
/// scenario that kept about a fifth of the controller's resident memory as
/// free but unreturned pages (peak RSS 377 MiB by default, 300 MiB with
/// two arenas). Call before threads start (arenas already made stay):
/// `main` calls it first thing, for every command. No effect elsewhere
/// than glibc.
pub fn limit_allocator_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// `M_ARENA_MAX` of glibc's malloc.h.
        const M_ARENA_MAX: libc::c_int = -8;
        // SAFETY: mallopt only sets a malloc parameter; any value is
        // accepted or refused by glibc (return 0), never undefined.
        let ok = unsafe { libc::mallopt(M_ARENA_MAX, 2) };
        if ok == 0 {
            tracing::debug!("malloc arena limit not set");
        }
    }
}
