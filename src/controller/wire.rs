//! Objects as the API server sends them (watch and list items, apply
//! responses), read straight into what the caches keep: the body as
//! one JSON tree without `managedFields`, and what our field manager owns.
//! No typed copy of the metadata and no tree of the other managers'
//! `managedFields` is built on the way (they were most of the transient
//! memory of a list).

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::ApiResource;
use kube::core::DynamicResourceScope;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::plan::{FIELD_MANAGER, Live, OwnedFields};

/// One object of an output kind as received. `meta` holds only what the
/// watcher reads (name, namespace, resourceVersion).
#[derive(Clone, Debug)]
pub struct Wire {
    meta: ObjectMeta,
    /// The body, metadata without `managedFields` included.
    body: Map<String, Value>,
    /// Our `Apply` entry of `managedFields`, read while deserializing.
    ours: Option<OwnedFields>,
}

impl Wire {
    /// The cached form: apiVersion and kind from discovery (list items
    /// lack them), summarised and packed ([`Live::from_parts`]).
    pub fn into_live(self, ar: &ApiResource) -> Live {
        let mut body = self.body;
        body.insert("apiVersion".into(), Value::String(ar.api_version.clone()));
        body.insert("kind".into(), Value::String(ar.kind.clone()));
        Live::from_parts(Value::Object(body), self.ours)
    }

    /// The object as the engine's store keeps it: apiVersion and kind from
    /// discovery, no `managedFields`.
    pub fn into_value(self, ar: &ApiResource) -> Value {
        let mut body = self.body;
        body.insert("apiVersion".into(), Value::String(ar.api_version.clone()));
        body.insert("kind".into(), Value::String(ar.kind.clone()));
        Value::Object(body)
    }
}

impl Resource for Wire {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

impl<'de> Deserialize<'de> for Wire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(WireVisitor)
    }
}

struct WireVisitor;

impl<'de> Visitor<'de> for WireVisitor {
    type Value = Wire;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Wire, A::Error> {
        let mut body = Map::new();
        let mut ours = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "metadata" {
                let meta: Option<Meta> = map.next_value()?;
                if let Some(meta) = meta {
                    ours = meta.ours;
                    body.insert(key, Value::Object(meta.rest));
                }
            } else {
                let value: Value = map.next_value()?;
                body.insert(key, value);
            }
        }
        let text = |k: &str| {
            body.get("metadata")
                .and_then(|m| m.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let meta = ObjectMeta {
            name: text("name"),
            namespace: text("namespace"),
            resource_version: text("resourceVersion"),
            ..ObjectMeta::default()
        };
        Ok(Wire { meta, body, ours })
    }
}

/// `metadata`: every field as JSON but `managedFields`, of which only our
/// entry is read.
struct Meta {
    rest: Map<String, Value>,
    ours: Option<OwnedFields>,
}

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MetaVisitor)
    }
}

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = Meta;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Meta, A::Error> {
        let mut rest = Map::new();
        let mut ours = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "managedFields" {
                let found: Option<Ours> = map.next_value()?;
                ours = found.and_then(|o| o.0);
            } else {
                let value: Value = map.next_value()?;
                rest.insert(key, value);
            }
        }
        Ok(Meta { rest, ours })
    }
}

/// `managedFields`, read one entry at a time: our `Apply` entry's fields,
/// the others dropped as soon as read.
struct Ours(Option<OwnedFields>);

impl<'de> Deserialize<'de> for Ours {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(OursVisitor)
    }
}

struct OursVisitor;

/// One `managedFields` entry: other fields are skipped.
#[derive(serde::Deserialize)]
struct Entry {
    manager: Option<String>,
    operation: Option<String>,
    #[serde(rename = "fieldsV1")]
    fields: Option<Value>,
}

impl<'de> Visitor<'de> for OursVisitor {
    type Value = Ours;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of managedFields entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ours, A::Error> {
        let mut ours = None;
        while let Some(e) = seq.next_element::<Entry>()? {
            if ours.is_none()
                && e.manager.as_deref() == Some(FIELD_MANAGER)
                && e.operation.as_deref() == Some("Apply")
            {
                ours = Some(OwnedFields::from_fields_v1(
                    e.fields.as_ref().unwrap_or(&Value::Null),
                ));
            }
        }
        Ok(Ours(ours))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::OutputKind;
    use crate::controller::apply::api_resource;
    use crate::engine::output::RBAC_API_VERSION;

    #[test]
    fn a_received_object_is_summarised_like_its_json() {
        let json = json!({"apiVersion": RBAC_API_VERSION, "kind": "Role",
            "metadata": {"name": "r", "namespace": "n", "resourceVersion": "7",
              "uid": "u1", "labels": {"a": "1"}, "annotations": {"b": "2"},
              "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace",
                "name": "n", "uid": "o1", "controller": true}],
              "managedFields": [
                {"manager": "kubectl", "operation": "Update",
                  "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}}}}},
                {"manager": FIELD_MANAGER, "operation": "Apply",
                  "apiVersion": RBAC_API_VERSION, "fieldsType": "FieldsV1",
                  "time": "2026-01-01T00:00:00Z",
                  "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}, "f:rules": {}}}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        let ar = api_resource(OutputKind::Role);
        let wire: Wire = serde_json::from_value(json.clone()).expect("object");
        assert_eq!(wire.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(wire.meta().namespace.as_deref(), Some("n"));
        let mut live = wire.into_live(&ar);
        assert!(live.is_packed());
        assert_eq!(live.label("a"), Some("1"));
        assert!(live.unpack());
        assert_eq!(live, Live::new(json));
        assert!(live.object()["metadata"].get("managedFields").is_none());
        let ours = live.ours().expect("ours");
        assert!(ours.top.contains("rules"));
        assert!(ours.labels.contains("a") && !ours.labels.contains("x"));
    }

    #[test]
    fn a_list_item_gets_its_kind_from_discovery_and_others_own_nothing_of_ours() {
        let item = json!({"metadata": {"name": "c", "resourceVersion": "3",
            "managedFields": [{"manager": "kubectl", "operation": "Apply",
              "fieldsV1": {"f:rules": {}}}]},
            "rules": []});
        let ar = api_resource(OutputKind::ClusterRole);
        let wire: Wire = serde_json::from_value(item).expect("object");
        let live = wire.into_live(&ar);
        assert_eq!(
            live.id().map(ToString::to_string),
            Some(
                crate::controller::plan::ObjectId::new(OutputKind::ClusterRole, "", "c")
                    .to_string()
            )
        );
        assert!(live.ours().is_none());
        // Bad input is an error, not a panic.
        assert!(serde_json::from_value::<Wire>(json!([1])).is_err());
        assert!(serde_json::from_value::<Wire>(json!({"metadata": {"managedFields": 3}})).is_err());
    }
}
