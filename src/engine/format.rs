//! Well-formed names, for the `format` condition operator: what a rule may
//! believe about a value read from the cluster before it becomes part of a
//! grant.

use crate::api::ValueFormat;

/// An RFC 1123 label: 1–63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// An API group a CustomResourceDefinition may define: a DNS subdomain with
/// a dot (the dotless groups are Kubernetes' own, core included), outside
/// the groups reserved for Kubernetes.
pub fn is_custom_group(s: &str) -> bool {
    let reserved = ["k8s.io", "kubernetes.io"];
    is_dns_subdomain(s)
        && s.contains('.')
        && !reserved
            .iter()
            .any(|r| s == *r || s.ends_with(&format!(".{r}")))
}

/// A CustomResourceDefinition name `<plural>.<group>`.
pub fn is_crd_name(s: &str) -> bool {
    match s.split_once('.') {
        Some((plural, group)) => is_dns_label(plural) && is_custom_group(group),
        None => false,
    }
}

/// Whether `s` is well formed as `format`.
pub fn check(format: ValueFormat, s: &str) -> bool {
    match format {
        ValueFormat::DnsLabel => is_dns_label(s),
        ValueFormat::DnsSubdomain => is_dns_subdomain(s),
        ValueFormat::CustomGroup => is_custom_group(s),
        ValueFormat::CrdName => is_crd_name(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_names() {
        for good in [
            "widgets.example.org",
            "buckets.s3.aws.upbound.io",
            "x.a.b",
            "a-b.c-d.e",
        ] {
            assert!(is_crd_name(good), "{good}");
        }
        for bad in [
            "*.*",
            "x.*",
            "*.rbac.authorization.k8s.io",
            "*.apps",
            "secrets.",
            "pods.core",
            "clusterroles.rbac.authorization.k8s.io",
            "foo.bar.k8s.io",
            "foo.kubernetes.io",
            "foo.k8s.io",
            "nodot",
            "",
            ".example.org",
            "Widgets.example.org",
            "widgets.Example.org",
            "widgets.example..org",
            "widgets.example.org.",
            "-w.example.org",
            "w/x.example.org",
            "w.exa mple.org",
            "w.example.org\n",
        ] {
            assert!(!is_crd_name(bad), "{bad:?}");
        }
        assert!(!is_crd_name(&format!("{}.example.org", "a".repeat(64))));
        assert!(is_crd_name(&format!("{}.example.org", "a".repeat(63))));
    }

    #[test]
    fn groups_and_labels() {
        assert!(is_custom_group("example.org"));
        for bad in [
            "",
            "*",
            "apps",
            "core",
            "rbac.authorization.k8s.io",
            "k8s.io",
            "x.kubernetes.io",
            "a..b",
        ] {
            assert!(!is_custom_group(bad), "{bad:?}");
        }
        assert!(is_dns_label("secrets"));
        assert!(!is_dns_label("*"));
        assert!(!is_dns_label(""));
        assert!(is_dns_subdomain("a.b"));
        assert!(!is_dns_subdomain(&"a.".repeat(127)));
    }
}
