//! What the engine knows of the kinds it emits: their API group and
//! version, and the group/kind of each [`OutputKind`]. The one place these
//! facts are spelled; every other module asks here.

use super::store::GroupKind;
use crate::api::OutputKind;

/// The API group of RBAC objects.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// apiVersion of every emitted object.
pub const RBAC_API_VERSION: &str = "rbac.authorization.k8s.io/v1";

/// The group/kind of an emitted kind.
pub fn output_gk(kind: OutputKind) -> GroupKind {
    GroupKind::new(RBAC_GROUP, kind.as_str())
}

/// The output kind of a group and kind, if it is one.
pub fn output_kind(gk: &GroupKind) -> Option<OutputKind> {
    // Compared in place: asked on every lookup, so no GroupKind is built.
    if gk.group != RBAC_GROUP {
        return None;
    }
    OutputKind::ALL.into_iter().find(|k| k.as_str() == gk.kind)
}

/// The group and kind of an output kind, built once.
pub fn gk_of(kind: OutputKind) -> &'static GroupKind {
    static GKS: std::sync::LazyLock<[GroupKind; 4]> =
        std::sync::LazyLock::new(|| OutputKind::ALL.map(output_gk));
    let at = OutputKind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or_default();
    &GKS[at]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_output_kind_maps_to_its_group_kind_and_back() {
        for kind in OutputKind::ALL {
            assert_eq!(gk_of(kind), &output_gk(kind));
            assert_eq!(output_gk(kind).group, RBAC_GROUP);
            assert_eq!(output_kind(&output_gk(kind)), Some(kind));
        }
        assert_eq!(output_kind(&GroupKind::new("", "ClusterRole")), None);
        assert_eq!(output_kind(&GroupKind::new(RBAC_GROUP, "Other")), None);
    }
}
