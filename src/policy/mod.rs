//! Policy over RBAC grants, in three parts: what a grant means and covers
//! ([`rbac`]: Kubernetes' own rule semantics and role aggregation), what no
//! output may do ([`denials`]: the default denials and their waivers), and
//! what an installation allows ([`allow`]: the allow-list). Every public
//! item is re-exported here: callers name `crate::policy::X`.

pub mod allow;
pub mod denials;
pub mod rbac;

pub use allow::*;
pub use denials::*;
pub use rbac::*;
