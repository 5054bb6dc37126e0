//! Tests of the world index, fed event by event.

use std::sync::Arc;

use super::listing::{KindWatch, Listing};
use super::owned::pack_map;
use super::*;
use crate::api::ManageLevel;
use crate::engine::Interest;
use crate::engine::compile::output_gk;
use crate::engine::output::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use serde_json::json;

#[test]
fn a_packed_map_keeps_every_entry_in_order() {
    let mut m: BTreeMap<u32, u32> = (0..5000).rev().map(|i| (i * 2, i)).collect();
    let before: Vec<(u32, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
    pack_map(&mut m);
    assert_eq!(m.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(), before);
    assert_eq!(m.get(&4000), Some(&2000));
    m.insert(1, 1);
    assert_eq!(m.len(), 5001);
    let mut empty: BTreeMap<u32, u32> = BTreeMap::new();
    pack_map(&mut empty);
    assert!(empty.is_empty());
}

fn rule(name: &str, generation: i64, kind: &str) -> RbacRule {
    let spec: RbacRuleSpec = serde_json::from_value(json!({
        "trigger": {"apiGroup": "example.org", "kind": kind, "metadataOnly": true},
        "outputs": [{"kind": "ClusterRole", "name": "x-{{trigger.metadata.name}}"}]
    }))
    .expect("spec");
    let mut r = RbacRule::new(name, spec);
    r.metadata.generation = Some(generation);
    r
}

/// An event of an output-kind watch, as the watch task makes it; an
/// object labelled ours without `managedFields` gets the entry our
/// server-side apply leaves (ours: we made it).
fn owned(kind: OutputKind, e: Event<Value>) -> Feed {
    Feed::Owned(kind, map_event(e, |o| Live::new(made_by_us(o))))
}

/// `o` as our apply leaves it: an `Apply` entry of our field manager
/// owning every label, annotation and top-level field, when labelled
/// ours and without `managedFields`.
fn made_by_us(mut o: Value) -> Value {
    if !crate::engine::output::is_managed(&o) || o["metadata"].get("managedFields").is_some() {
        return o;
    }
    let keys = |v: &Value| -> serde_json::Map<String, Value> {
        v.as_object()
            .into_iter()
            .flat_map(|m| m.keys())
            .map(|k| (format!("f:{k}"), json!({})))
            .collect()
    };
    let mut fields = keys(&o);
    fields.insert(
        "f:metadata".into(),
        json!({"f:labels": keys(&o["metadata"]["labels"]),
               "f:annotations": keys(&o["metadata"]["annotations"])}),
    );
    o["metadata"]["managedFields"] =
        json!([{"manager": "rbac-rules", "operation": "Apply", "fieldsV1": fields}]);
    o
}

fn widget(name: &str) -> Value {
    json!({"apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": name}})
}

/// Names of the stored objects of `gk`, in store order.
fn stored_names<'a>(w: &'a World, gk: &GroupKind) -> Vec<&'a str> {
    w.store
        .list(gk)
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect()
}

fn listed(world: &mut World, feed: impl Fn(Event<Value>) -> Feed, objects: Vec<Value>) {
    world.apply(feed(Event::Init));
    for o in objects {
        world.apply(feed(Event::InitApply(o)));
    }
    world.apply(feed(Event::InitDone));
}

fn base_world() -> World {
    let mut w = World::new(None);
    w.apply(Feed::Rules(Box::new(Event::Init)));
    w.apply(Feed::Rules(Box::new(Event::InitApply(rule(
        "r", 1, "Widget",
    )))));
    assert!(!w.base_synced());
    w.apply(Feed::Rules(Box::new(Event::InitDone)));
    for k in OutputKind::ALL {
        listed(&mut w, |e| owned(k, e), vec![]);
    }
    // Nothing is written before the tenant rules have listed too.
    assert!(!w.base_synced());
    w.apply(Feed::Tenants(Box::new(Event::Init)));
    w.apply(Feed::Tenants(Box::new(Event::InitDone)));
    assert!(w.base_synced());
    w
}

fn watch(w: &mut World, gk: &GroupKind, epoch: u64) {
    let interest = w.interests(ManageLevel::All).remove(gk).expect("interest");
    assert!(interest.metadata_only);
    w.kinds.insert(
        gk.clone(),
        KindWatch {
            interest,
            unresolved: None,
            epoch,
            listing: Listing::default(),
            seen: None,
            watching: true,
        },
    );
}

#[test]
fn an_allow_list_adds_watches_on_every_role() {
    let rbac = |k: &str| GroupKind::new("rbac.authorization.k8s.io", k);
    let mut without = base_world();
    let kinds = without.interests(ManageLevel::All);
    // Its rule emits neither a binding nor an aggregated role.
    assert!(!kinds.contains_key(&rbac("ClusterRole")));

    let mut with = World::new(Some("limits".into()));
    with.apply(Feed::Rules(Box::new(Event::Init)));
    with.apply(Feed::Rules(Box::new(Event::InitApply(rule(
        "r", 1, "Widget",
    )))));
    with.apply(Feed::Rules(Box::new(Event::InitDone)));
    let kinds = with.interests(ManageLevel::All);
    for k in ["ClusterRole", "Role"] {
        let i = kinds
            .get(&rbac(k))
            .expect("watched for the allow-list check");
        assert!(!i.metadata_only, "{k}: rules are needed, not just metadata");
    }
}

#[test]
fn a_new_resource_version_alone_is_not_a_change() {
    let mut w = base_world();
    let gk = GroupKind::new("example.org", "Widget");
    watch(&mut w, &gk, 1);
    let version = |rv: &str, label: &str| {
        let mut o = widget("a");
        o["metadata"]["resourceVersion"] = json!(rv);
        o["metadata"]["labels"] = json!({"l": label});
        o
    };
    listed(
        &mut w,
        |e| Feed::Kind(gk.clone(), 1, e),
        vec![version("1", "x")],
    );
    let key = (String::new(), "a".to_string());
    // A write the watch cut away (a status update) bumps only the
    // resourceVersion: no change, the stored copy stays.
    let c = w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(version("2", "x"))));
    assert!(!c.dirty);
    assert_eq!(w.store.get(&gk, &key), Some(&version("1", "x")));
    // Relisted so: the same.
    let before = w.store.version();
    w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
    w.apply(Feed::Kind(
        gk.clone(),
        1,
        Event::InitApply(version("3", "x")),
    ));
    w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
    assert_eq!(w.store.changes_since(before).map(Iterator::count), Some(0));
    assert_eq!(w.store.get(&gk, &key), Some(&version("1", "x")));
    // Anything else that changes is a change, with its resourceVersion.
    let c = w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(version("4", "y"))));
    assert!(c.dirty);
    assert_eq!(w.store.get(&gk, &key), Some(&version("4", "y")));
}

#[test]
fn a_kind_read_only_as_triggers_is_held_packed_and_read_one_at_a_time() {
    let mut w = base_world();
    let gk = GroupKind::new("example.org", "Widget");
    let wanted = w.interests(ManageLevel::All);
    assert!(wanted[&gk].packable);
    w.pack_kinds(&wanted);
    watch(&mut w, &gk, 1);
    let version = |name: &str, rv: &str, label: &str| {
        let mut o = widget(name);
        o["metadata"]["resourceVersion"] = json!(rv);
        o["metadata"]["labels"] = json!({"l": label});
        o
    };
    let feed = |e| Feed::Kind(gk.clone(), 1, e);
    listed(
        &mut w,
        feed,
        vec![version("a", "1", "x"), version("b", "1", "x")],
    );
    assert!(w.store.packed_bytes() > 0);
    let key = |n: &str| (String::new(), n.to_string());
    // A new resourceVersion alone: no change, the stored copy stays.
    assert!(!w.apply(feed(Event::Apply(version("a", "2", "x")))).dirty);
    assert_eq!(
        w.store.get_owned(&gk, &key("a")),
        Some(Arc::new(version("a", "1", "x")))
    );
    // A relist without b: only b is journaled.
    let before = w.store.version();
    w.apply(feed(Event::Init));
    w.apply(feed(Event::InitApply(version("a", "3", "x"))));
    w.apply(feed(Event::InitDone));
    let changed: Vec<_> = w.store.changes_since(before).expect("journal").collect();
    assert_eq!(changed, [(&gk, &key("b"))]);
    // A real change is one, with its version.
    assert!(w.apply(feed(Event::Apply(version("a", "4", "y")))).dirty);
    assert_eq!(
        w.store.get_owned(&gk, &key("a")),
        Some(Arc::new(version("a", "4", "y")))
    );
    // The events and the evaluation's keys read the kind one object at a
    // time: never back into trees.
    assert_eq!(w.store.trees_read_back(), 0);
    // A rule that lists Widgets (a related set) takes the packing back.
    let lister: RbacRuleSpec = serde_json::from_value(json!({
        "related": [{"name": "all", "objects": {"apiGroup": "example.org", "kind": "Widget"}}],
        "outputs": [{"kind": "ClusterRole", "name": "all-widgets"}]
    }))
    .expect("spec");
    w.apply(Feed::Rules(Box::new(Event::Apply(RbacRule::new(
        "lister", lister,
    )))));
    let wanted = w.interests(ManageLevel::All);
    assert!(!wanted[&gk].packable);
    w.pack_kinds(&wanted);
    assert_eq!(w.store.packed_bytes(), 0);
    assert_eq!(w.store.get(&gk, &key("a")), Some(&version("a", "4", "y")));
    assert_eq!(w.store.trees_read_back(), 0);
}

#[test]
fn a_rule_waits_for_its_kind_then_runs() {
    let mut w = base_world();
    let gk = GroupKind::new("example.org", "Widget");
    watch(&mut w, &gk, 1);
    assert!(matches!(w.holds().get("r"), Some(Hold::WaitingForSync(_))));
    assert!(!w.kinds_settled());
    // A list in progress starts no reconcile and the rule stays held;
    // InitDone completes it.
    w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
    let c = w.apply(Feed::Kind(gk.clone(), 1, Event::InitApply(widget("a"))));
    assert!(!c.dirty);
    assert!(matches!(w.holds().get("r"), Some(Hold::WaitingForSync(_))));
    let c = w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
    assert!(c.dirty);
    assert_eq!(w.store.list(&gk).count(), 1);
    assert!(w.holds().is_empty());
    // A relist keeps the copy of an unchanged object and sweeps what
    // it no longer holds, at its end.
    w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(widget("b"))));
    let key = |n: &str| (String::new(), n.to_string());
    let a = w.store.get(&gk, &key("a")).expect("a") as *const Value;
    w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
    w.apply(Feed::Kind(gk.clone(), 1, Event::InitApply(widget("a"))));
    assert_eq!(w.store.list(&gk).count(), 2);
    w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
    assert_eq!(w.store.list(&gk).count(), 1);
    assert!(std::ptr::eq(a, w.store.get(&gk, &key("a")).expect("a")));
    assert!(w.kinds_settled());
    // Events of a stopped predecessor are ignored.
    let c = w.apply(Feed::Kind(gk.clone(), 0, Event::Apply(widget("b"))));
    assert_eq!(c, Change::default());
    // An unchanged object is not a change.
    let c = w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(widget("a"))));
    assert!(!c.dirty);
}

/// The base world plus two rules: "copier" copies the rules of the
/// ClusterRoles "r" emits; "other" emits a Role nobody reads.
fn world_with_copier_and_other() -> World {
    let mut w = base_world();
    let spec: RbacRuleSpec = serde_json::from_value(json!({
        "outputs": [{"kind": "ClusterRole", "name": "copied",
                     "rulesFrom": {"clusterRoleNames": ["x-a"]}}]
    }))
    .expect("spec");
    w.apply(Feed::Rules(Box::new(Event::Apply(RbacRule::new(
        "copier", spec,
    )))));
    let spec: RbacRuleSpec = serde_json::from_value(json!({
        "outputs": [{"kind": "Role", "name": "other", "namespace": "default"}]
    }))
    .expect("spec");
    w.apply(Feed::Rules(Box::new(Event::Apply(RbacRule::new(
        "other", spec,
    )))));
    w.interests(ManageLevel::All);
    w
}

#[test]
fn a_rule_reading_what_a_waiting_rule_emits_waits_too() {
    // A rule emitting only what nobody reads ("other") does not wait.
    let mut w = world_with_copier_and_other();
    let gk = GroupKind::new("example.org", "Widget");
    watch(&mut w, &gk, 1);
    let holds = w.holds();
    assert!(matches!(holds.get("r"), Some(Hold::WaitingForSync(_))));
    match holds.get("copier") {
        Some(Hold::WaitingForSync(why)) => assert!(why.contains("r"), "{why}"),
        other => panic!("copier: {other:?}"),
    }
    assert!(!holds.contains_key("other"), "{holds:?}");
    listed(&mut w, |e| Feed::Kind(gk.clone(), 1, e), vec![widget("a")]);
    let holds = w.holds();
    assert!(!holds.contains_key("r"), "{holds:?}");
    assert!(
        !matches!(holds.get("copier"), Some(Hold::WaitingForSync(why)) if why.contains("outputs it reads")),
        "{holds:?}"
    );
}

#[test]
fn a_slow_rule_and_its_readers_go_to_the_slow_lane_until_its_spec_changes() {
    let mut w = world_with_copier_and_other();
    let gk = GroupKind::new("example.org", "Widget");
    watch(&mut w, &gk, 1);
    listed(&mut w, |e| Feed::Kind(gk.clone(), 1, e), vec![widget("a")]);
    watch_whole(&mut w, &output_gk(OutputKind::ClusterRole));
    assert!(w.holds().is_empty(), "{:?}", w.holds());
    w.move_to_slow_lane(["r".to_string(), "gone".to_string()]);
    let holds = w.holds();
    assert!(
        matches!(holds.get("r"), Some(Hold::SlowLane(_))),
        "{holds:?}"
    );
    // The copier reads what "r" emits: it goes with it.
    match holds.get("copier") {
        Some(Hold::SlowLane(why)) => assert!(why.contains("r"), "{why}"),
        other => panic!("copier: {other:?}"),
    }
    assert!(!holds.contains_key("other"), "{holds:?}");
    assert!(!holds.contains_key("gone"), "{holds:?}");
    // The slow lane's copy of the store shares the world's objects, and
    // a copy made again with nothing changed is no change.
    let mut store = ObjectStore::new();
    assert!(store.follow(&w.store));
    let key = (String::new(), "a".to_string());
    assert!(Arc::ptr_eq(
        store.get_shared(&gk, &key).expect("copied"),
        w.store.get_shared(&gk, &key).expect("stored")
    ));
    // Not even the index is copied: the lane's is the world's.
    assert_eq!(store.shared_kinds(&w.store), w.store.kinds().count());
    assert!(!store.follow(&w.store));
    w.apply(Feed::Kind(gk.clone(), 1, Event::Apply(widget("b"))));
    w.apply(Feed::Kind(gk.clone(), 1, Event::Delete(widget("a"))));
    assert!(store.follow(&w.store));
    let names: Vec<String> = store.entries(&gk).map(|(k, _)| k.1.clone()).collect();
    assert_eq!(names, vec!["b"]);
    // A rule waiting for a list is not evaluated by the slow lane: its
    // readers wait too.
    let mut waiting = w.holds();
    waiting.insert("r".into(), Hold::WaitingForSync("x".into()));
    waiting.remove("copier");
    w.hold_readers_of_waiting(&mut waiting);
    assert!(
        matches!(waiting.get("copier"), Some(Hold::WaitingForSync(_))),
        "{waiting:?}"
    );
    // A new spec gets a new chance in the main pass.
    let mut edited = rule("r", 2, "Widget");
    edited.spec.outputs[0].name = "y-{{trigger.metadata.name}}".into();
    w.apply(Feed::Rules(Box::new(Event::Apply(edited))));
    w.interests(ManageLevel::All);
    let holds = w.holds();
    assert!(holds.is_empty(), "{holds:?}");
}

#[test]
fn a_kind_that_stops_being_served_holds_its_rules() {
    let mut w = base_world();
    let gk = GroupKind::new("example.org", "Widget");
    watch(&mut w, &gk, 1);
    listed(&mut w, |e| Feed::Kind(gk.clone(), 1, e), vec![widget("a")]);
    let status = kube::core::Status::failure("gone", "NotFound").with_code(404);
    let err = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)));
    let c = w.apply(Feed::Error(Source::Kind(gk.clone(), 1), err));
    assert!(c.lost_kind);
    assert!(matches!(w.holds().get("r"), Some(Hold::KindNotServed(_))));
    // Not served is settled: it does not block readiness or pruning of
    // other rules, and the last list is kept.
    assert!(w.kinds_settled());
    assert_eq!(w.store.list(&gk).count(), 1);
    assert!(w.has_unresolved());
}

#[test]
fn a_failed_list_makes_the_cache_stale() {
    let mut w = base_world();
    let status = kube::core::Status::failure("denied", "Forbidden").with_code(403);
    let err = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)));
    w.apply(Feed::Error(Source::Owned(OutputKind::Role), err));
    assert!(!w.base_synced());
    listed(&mut w, |e| owned(OutputKind::Role, e), vec![]);
    assert!(w.base_synced());
}

#[test]
fn a_list_in_progress_is_known_until_its_end() {
    let mut w = base_world();
    assert!(!w.listing());
    w.apply(owned(OutputKind::Role, Event::Init));
    assert!(w.listing());
    w.apply(owned(OutputKind::Role, Event::InitDone));
    assert!(!w.listing());
    w.apply(Feed::Rules(Box::new(Event::Init)));
    assert!(w.listing());
    w.apply(Feed::Rules(Box::new(Event::InitDone)));
    assert!(!w.listing());
}

#[test]
fn status_only_rule_changes_re_render_nothing() {
    let mut w = base_world();
    let mut r = rule("r", 1, "Widget");
    r.status = Some(Default::default());
    let c = w.apply(Feed::Rules(Box::new(Event::Apply(r))));
    assert_eq!(c, Change::default());
    assert!(w.rules["r"].status.is_some());
    let c = w.apply(Feed::Rules(Box::new(Event::Apply(rule("r", 2, "Gadget")))));
    assert!(c.dirty && c.rules);
}

#[test]
fn owned_objects_are_cached_without_managed_fields() {
    let mut w = base_world();
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "x", "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                     "managedFields": [{"manager": "rbac-rules", "operation": "Apply",
                                        "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]}});
    let c = w.apply(owned(OutputKind::ClusterRole, Event::Apply(role.clone())));
    assert!(c.dirty);
    let live = &w.owned[&ObjectId::new(OutputKind::ClusterRole, "", "x")];
    assert!(live.object()["metadata"].get("managedFields").is_none());
    assert!(live.ours().is_some_and(|o| o.labels.contains("a")));
    let c = w.apply(owned(OutputKind::ClusterRole, Event::Delete(role)));
    assert!(c.dirty);
    assert!(w.owned.is_empty());
}

#[test]
fn the_cache_learns_from_writes_and_ignores_older_watch_events() {
    let mut w = base_world();
    let id = ObjectId::new(OutputKind::ClusterRole, "", "x");
    let gk = output_gk(OutputKind::ClusterRole);
    let key = (String::new(), "x".to_string());
    let version = |rv: &str, uid: &str, verbs: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "x", "resourceVersion": rv, "uid": uid,
                         "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
    };
    let c = w.apply(Feed::Learned(Learned::Applied(Live::new(version(
        "20",
        "u1",
        json!(["get"]),
    )))));
    assert!(c.dirty);
    assert_eq!(w.owned[&id].resource_version(), Some("20"));
    // No rule reads the kind: packed, and not in the engine's store
    // until a plan keeps it without a desired copy.
    assert!(w.owned[&id].is_packed());
    assert!(w.store.get(&gk, &key).is_none());
    assert!(w.unpack([&id]));
    assert!(w.store.get(&gk, &key).is_some());
    // The watch then delivers an event from before the write.
    let c = w.apply(owned(
        OutputKind::ClusterRole,
        Event::Apply(version("12", "u1", json!(["list"]))),
    ));
    assert!(!c.dirty);
    assert_eq!(w.owned[&id].resource_version(), Some("20"));
    // A newer one replaces it.
    let c = w.apply(owned(
        OutputKind::ClusterRole,
        Event::Apply(version("21", "u1", json!(["watch"]))),
    ));
    assert!(c.dirty);
    assert_eq!(w.owned[&id].resource_version(), Some("21"));
    // A delete of another object of the name (made again since) keeps
    // this one; a delete of this one removes it at once.
    assert!(!w.learn(Learned::Deleted(id.clone(), Some("u0".into()))));
    assert!(w.owned.contains_key(&id));
    assert!(w.learn(Learned::Deleted(id.clone(), Some("u1".into()))));
    assert!(w.owned.is_empty());
    assert!(w.store.get(&gk, &key).is_none());
}

#[test]
fn a_missing_allow_list_holds_every_rule() {
    let mut w = World::new(Some("limits".into()));
    listed(
        &mut w,
        |e| Feed::Rules(Box::new(map_event(e, |_| rule("r", 1, "Widget")))),
        vec![json!({})],
    );
    for k in OutputKind::ALL {
        listed(&mut w, |e| owned(k, e), vec![]);
    }
    w.apply(Feed::Tenants(Box::new(Event::Init)));
    w.apply(Feed::Tenants(Box::new(Event::InitDone)));
    assert!(!w.base_synced());
    w.apply(Feed::Allow(Box::new(Event::Init)));
    w.apply(Feed::Allow(Box::new(Event::InitDone)));
    assert!(w.base_synced());
    assert!(matches!(
        w.holds().get("r"),
        Some(Hold::AllowListNotFound(_))
    ));
}

fn cluster_role(name: &str, ours: bool) -> Value {
    let labels = if ours {
        json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE})
    } else {
        json!({"app": "other"})
    };
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
}

#[test]
fn other_objects_of_an_output_kind_are_known_by_name_only() {
    let mut w = base_world();
    let gk = output_gk(OutputKind::ClusterRole);
    let id = ObjectId::new(OutputKind::ClusterRole, "", "x");
    listed(
        &mut w,
        |e| owned(OutputKind::ClusterRole, e),
        vec![cluster_role("x", false), cluster_role("ours", true)],
    );
    assert!(w.foreign.contains(&id));
    assert!(!w.owned.contains_key(&id));
    // No rule reads ClusterRoles: none in the engine's store, ours
    // packed in our cache.
    assert!(stored_names(&w, &gk).is_empty());
    assert!(w.owned[&ObjectId::new(OutputKind::ClusterRole, "", "ours")].is_packed());
    // Taking our label off moves an object out of our cache in the same
    // event that names it someone else's; putting it on moves it back.
    let c = w.apply(owned(
        OutputKind::ClusterRole,
        Event::Apply(cluster_role("ours", false)),
    ));
    assert!(c.dirty);
    let ours = ObjectId::new(OutputKind::ClusterRole, "", "ours");
    assert!(w.foreign.contains(&ours) && !w.owned.contains_key(&ours));
    assert_eq!(w.store.list(&gk).count(), 0);
    w.apply(owned(
        OutputKind::ClusterRole,
        Event::Apply(cluster_role("x", true)),
    ));
    assert!(!w.foreign.contains(&id) && w.owned.contains_key(&id));
    // A deleted object frees its name.
    w.apply(owned(
        OutputKind::ClusterRole,
        Event::Delete(cluster_role("ours", false)),
    ));
    assert!(!w.foreign.contains(&ours));
}

/// A ClusterRole labelled ours by someone else: its managedFields hold
/// entries of other managers only (a kubectl create, a server-side
/// apply under another name).
fn forged_role(name: &str, manager: &str, operation: &str) -> Value {
    let mut o = cluster_role(name, true);
    o["metadata"]["annotations"] = json!({"rbacrules.io/rule": "r"});
    o["metadata"]["managedFields"] =
        json!([{"manager": manager, "operation": operation, "fieldsV1": {}}]);
    o
}

#[test]
fn objects_others_label_ours_are_foreign_and_reported() {
    let mut w = base_world();
    let gk = output_gk(OutputKind::ClusterRole);
    let spec: RbacRuleSpec = serde_json::from_value(json!({
        "trigger": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole"},
        "outputs": [{"kind": "ClusterRole", "name": "copy-{{trigger.metadata.name}}"}]
    }))
    .expect("spec");
    let mut reader = RbacRule::new("reader", spec);
    reader.metadata.generation = Some(1);
    w.apply(Feed::Rules(Box::new(Event::Apply(reader))));
    let interest = w.interests(ManageLevel::All).remove(&gk).expect("interest");
    let epoch = w.next_epoch();
    w.watch_kind(interest, epoch, None);
    listed(
        &mut w,
        |e| owned(OutputKind::ClusterRole, e),
        vec![
            forged_role("created", "kubectl-create", "Update"),
            forged_role("applied", "kubectl", "Apply"),
            // Our manager's name, but not by apply: not our write.
            forged_role("updated", "rbac-rules", "Update"),
            cluster_role("ours", true),
        ],
    );
    let id = |n: &str| ObjectId::new(OutputKind::ClusterRole, "", n);
    for n in ["created", "applied", "updated"] {
        assert!(!w.owned.contains_key(&id(n)), "{n}");
        assert!(w.foreign.contains(&id(n)), "{n}");
        assert_eq!(w.forged.get(&id(n)), Some(&Some("r".to_string())), "{n}");
        // The engine sees it as anyone's: without the claim.
        let stored = w.store.get(&gk, &id(n).store_key()).expect("stored");
        assert!(!crate::engine::output::is_managed(stored), "{n}");
        assert_eq!(stored["metadata"]["annotations"]["rbacrules.io/rule"], "r");
    }
    assert!(w.owned.contains_key(&id("ours")) && !w.forged.contains_key(&id("ours")));
    let snap_forged = w.snapshot(None, &BTreeMap::new()).forged.len();
    assert_eq!(snap_forged, 3);
    // The label taken off: no longer a claim; deleted: forgotten.
    w.apply(owned(
        OutputKind::ClusterRole,
        Event::Apply(cluster_role("created", false)),
    ));
    assert!(!w.forged.contains_key(&id("created")));
    w.apply(owned(
        OutputKind::ClusterRole,
        Event::Delete(forged_role("applied", "kubectl", "Apply")),
    ));
    assert!(!w.forged.contains_key(&id("applied")) && !w.foreign.contains(&id("applied")));
}

#[test]
fn a_rule_reading_an_output_kind_is_fed_by_the_output_watch() {
    let mut w = base_world();
    let gk = output_gk(OutputKind::ClusterRole);
    listed(
        &mut w,
        |e| owned(OutputKind::ClusterRole, e),
        vec![cluster_role("other", false), cluster_role("ours", true)],
    );
    let spec: RbacRuleSpec = serde_json::from_value(json!({
        "trigger": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole"},
        "outputs": [{"kind": "ClusterRole", "name": "copy-{{trigger.metadata.name}}"}]
    }))
    .expect("spec");
    let mut reader = RbacRule::new("reader", spec);
    reader.metadata.generation = Some(1);
    w.apply(Feed::Rules(Box::new(Event::Apply(reader))));
    let interest = w.interests(ManageLevel::All).remove(&gk).expect("interest");
    let epoch = w.next_epoch();
    w.watch_kind(interest, epoch, None);
    // The last list kept only the others' names: list again first.
    assert!(w.relist_outputs(OutputKind::ClusterRole));
    assert!(!w.base_synced());
    assert!(matches!(
        w.holds().get("reader"),
        Some(Hold::WaitingForSync(_))
    ));
    listed(
        &mut w,
        |e| owned(OutputKind::ClusterRole, e),
        vec![cluster_role("other", false), cluster_role("ours", true)],
    );
    assert!(w.base_synced() && w.kinds_settled());
    // The base rule "r" emits ClusterRoles: until its Widgets are
    // listed, a reader of ClusterRoles waits for it.
    assert!(matches!(
        w.holds().get("reader"),
        Some(Hold::WaitingForSync(why)) if why.contains("outputs it reads")
    ));
    let widgets = GroupKind::new("example.org", "Widget");
    watch(&mut w, &widgets, 9);
    listed(&mut w, |e| Feed::Kind(widgets.clone(), 9, e), vec![]);
    assert!(!w.holds().contains_key("reader"));
    // Others' ClusterRoles are in the store; ours are packed (no rule
    // sees them while a desired copy stands for them) until a plan
    // keeps them, then shared with our cache.
    assert_eq!(stored_names(&w, &gk), vec!["other"]);
    let ours = ObjectId::new(OutputKind::ClusterRole, "", "ours");
    let key = (String::new(), "ours".to_string());
    assert!(w.owned[&ours].is_packed());
    assert!(w.unpack([&ours]));
    assert!(std::ptr::eq(
        w.store.get(&gk, &key).expect("stored"),
        w.owned[&ours].object()
    ));
    // No rule reads them any more: the others go, ours stay.
    w.forget_kind(&gk);
    assert_eq!(stored_names(&w, &gk), vec!["ours"]);
}

/// One of our ClusterRoles as the server returns it, with `verbs`.
fn served_role(rv: &str, verbs: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "s", "resourceVersion": rv, "uid": "u-s",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
            "annotations": {"rbacrules.io/rule": "r"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "u-n"}]},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
}

#[test]
fn our_objects_stay_packed_where_a_rule_reads_the_kind() {
    let mut w = base_world();
    let kind = OutputKind::ClusterRole;
    let gk = output_gk(kind);
    watch_whole(&mut w, &gk);
    let id = ObjectId::new(kind, "", "s");
    let key = (String::new(), "s".to_string());
    // The response to our write: while our desired copy stands for it,
    // no rule's view shows it and the engine's store holds no copy.
    let c = w.apply(Feed::Learned(Learned::Applied(Live::new(served_role(
        "5",
        json!(["get"]),
    )))));
    assert!(c.dirty);
    assert!(w.owned[&id].is_packed());
    assert!(w.store.get(&gk, &key).is_none());
    // The watch's echo of that version changes nothing.
    let c = w.apply(owned(kind, Event::Apply(served_role("5", json!(["get"])))));
    assert!(!c.dirty);
    assert!(w.owned[&id].is_packed());
    // Its rule is held: the view shows the live copy, so it is in the
    // store before the evaluation (whole: a rule reads the kind).
    assert!(!w.unpack_held(&BTreeMap::new()));
    let holds = BTreeMap::from([("r".to_string(), Hold::WaitingForSync("x".into()))]);
    assert!(w.unpack_held(&holds));
    assert!(!w.unpack_held(&holds));
    let stored = w.store.get(&gk, &key).expect("stored");
    assert_eq!(stored["metadata"]["uid"], "u-s");
    assert_eq!(stored["rules"][0]["verbs"], json!(["get"]));
    // A new version is packed again until a plan or a hold needs it.
    w.apply(owned(kind, Event::Apply(served_role("7", json!(["*"])))));
    assert!(w.owned[&id].is_packed());
    assert!(w.store.get(&gk, &key).is_none());
    assert!(w.unpack_held(&holds));
    assert_eq!(
        w.store.get(&gk, &key).expect("stored")["rules"][0]["verbs"],
        json!(["*"])
    );
}

#[test]
fn a_relist_of_the_same_version_leaves_a_held_rules_unpacked_copy_in_the_store() {
    let mut w = base_world();
    let kind = OutputKind::ClusterRole;
    let gk = output_gk(kind);
    watch_whole(&mut w, &gk);
    let id = ObjectId::new(kind, "", "s");
    w.apply(Feed::Learned(Learned::Applied(Live::new(served_role(
        "5",
        json!(["get"]),
    )))));
    let holds = BTreeMap::from([("r".to_string(), Hold::SlowLane("r".into()))]);
    assert!(w.unpack_held(&holds));
    let version = w.store.version();
    // The control plane comes back: every watch lists again, the same
    // version. Nothing changed: the store journals nothing (the engine
    // renders nothing), and the next hold unpacks nothing.
    w.apply(owned(kind, Event::Init));
    let c = w.apply(owned(
        kind,
        Event::InitApply(served_role("5", json!(["get"]))),
    ));
    assert!(!c.dirty);
    w.apply(owned(kind, Event::InitDone));
    assert_eq!(w.store.version(), version);
    assert!(!w.owned[&id].is_packed());
    assert!(!w.unpack_held(&holds));
    assert_eq!(w.store.version(), version);
    // A new version still replaces it (packed, out of the store until
    // the hold needs it again).
    w.apply(owned(kind, Event::Apply(served_role("6", json!(["list"])))));
    assert!(w.owned[&id].is_packed());
    assert_ne!(w.store.version(), version);
}

#[test]
fn the_main_pass_leaves_the_slow_lanes_roles_packed() {
    let mut w = base_world();
    for kind in [OutputKind::ClusterRole, OutputKind::Role] {
        watch_whole(&mut w, &output_gk(kind));
    }
    let mut role = served_role("5", json!(["get"]));
    role["kind"] = json!("Role");
    role["metadata"]["namespace"] = json!("team");
    role["metadata"]["uid"] = json!("u-r");
    w.apply(Feed::Learned(Learned::Applied(Live::new(role))));
    w.apply(Feed::Learned(Learned::Applied(Live::new(served_role(
        "6",
        json!(["get"]),
    )))));
    let role = ObjectId::new(OutputKind::Role, "team", "s");
    let cluster_role = ObjectId::new(OutputKind::ClusterRole, "", "s");
    let lane = BTreeMap::from([("r".to_string(), Hold::SlowLane("slow".into()))]);
    // The main pass holds the lane's rule: its ClusterRole is unpacked
    // (an aggregate may select it), its Role is not (only policy would
    // read it, and the lane judges it).
    assert!(w.unpack_held_for_main(&lane));
    assert!(!w.owned[&cluster_role].is_packed());
    assert!(w.owned[&role].is_packed());
    assert!(
        w.store
            .get(&output_gk(OutputKind::Role), &role.store_key())
            .is_none()
    );
    assert!(lane_role(&role, lane.get("r")));
    assert!(!lane_role(&cluster_role, lane.get("r")));
    // Held for another reason, the Role is unpacked as before.
    let waiting = BTreeMap::from([("r".to_string(), Hold::WaitingForSync("x".into()))]);
    assert!(!lane_role(&role, waiting.get("r")));
    assert!(w.unpack_held_for_main(&waiting));
    assert!(!w.owned[&role].is_packed());
}

#[test]
fn our_objects_are_kept_slim_unless_a_rule_reads_the_kind() {
    let mut w = base_world();
    let kind = OutputKind::ClusterRole;
    let id = ObjectId::new(kind, "", "s");
    w.apply(owned(kind, Event::Apply(served_role("5", json!(["get"])))));
    // Packed while a desired copy may stand for it: the plan reads the
    // summary, and the engine's store holds no copy.
    let gk = output_gk(kind);
    let key = (String::new(), "s".to_string());
    assert!(w.owned[&id].is_packed());
    assert!(w.store.get(&gk, &key).is_none());
    assert_eq!(w.owned[&id].rule(), Some("r"));
    // A plan keeps it: policy judges its slim body.
    assert!(w.unpack([&id]));
    let live = &w.owned[&id];
    let meta = live.object()["metadata"].as_object().expect("metadata");
    let mut keys: Vec<&str> = meta.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        vec!["annotations", "labels", "name", "resourceVersion"]
    );
    // What the plan and policy read is still there.
    assert_eq!(live.uid(), Some("u-s"));
    assert_eq!(live.rule(), Some("r"));
    assert!(live.is_managed());
    assert_eq!(live.object()["rules"][0]["verbs"], json!(["get"]));
    // The store the engine judges shares the slim copy.
    assert!(std::ptr::eq(
        w.store.get(&gk, &key).expect("stored"),
        w.owned[&id].object()
    ));
    // A rule reads ClusterRoles: the next copy is packed whole, and
    // unpacked whole when a plan keeps it.
    watch_whole(&mut w, &gk);
    w.apply(owned(kind, Event::Apply(served_role("6", json!(["get"])))));
    assert!(w.owned[&id].is_packed());
    assert!(w.unpack([&id]));
    let whole = &w.owned[&id].object()["metadata"];
    assert_eq!(whole["uid"], "u-s");
    assert_eq!(whole["ownerReferences"][0]["name"], "n");
}

#[test]
fn roles_no_rule_reads_are_packed_until_a_plan_keeps_them() {
    let mut w = base_world();
    let kind = OutputKind::Role;
    let id = ObjectId::new(kind, "n", "s");
    let role = |rv: &str, verbs: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "s", "namespace": "n", "resourceVersion": rv, "uid": "u",
                "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                "annotations": {"rbacrules.io/rule": "r", "rbacrules.io/trigger": "T/n"}},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}]})
    };
    assert!(
        w.apply(owned(kind, Event::Apply(role("5", json!(["get"])))))
            .dirty
    );
    let gk = output_gk(kind);
    let key = ("n".to_string(), "s".to_string());
    let live = &w.owned[&id];
    assert!(live.is_packed());
    assert!(live.shared().is_none());
    assert_eq!(
        (live.rule(), live.trigger(), live.resource_version()),
        (Some("r"), Some("T/n"), Some("5"))
    );
    assert!(w.store.get(&gk, &key).is_none());
    // Compared by digest while packed.
    let mut desired = role("", json!(["get"]));
    desired["metadata"]
        .as_object_mut()
        .expect("metadata")
        .retain(|k, _| k != "resourceVersion" && k != "uid");
    assert!(crate::controller::live::differences(&desired, &w.owned[&id]).is_empty());
    // A plan keeps it without a desired copy: policy must see its rules.
    assert!(w.unpack([&id]));
    assert!(!w.unpack([&id]));
    let stored = w.store.get(&gk, &key).expect("stored");
    assert_eq!(stored["rules"][0]["verbs"], json!(["get"]));
    // The same version again leaves it unpacked; a new one is packed.
    assert!(
        !w.apply(owned(kind, Event::Apply(role("5", json!(["get"])))))
            .dirty
    );
    assert!(!w.owned[&id].is_packed());
    assert!(
        w.apply(owned(kind, Event::Apply(role("6", json!(["*"])))))
            .dirty
    );
    assert!(w.owned[&id].is_packed());
    assert_eq!(
        crate::controller::live::differences(&desired, &w.owned[&id]),
        vec!["rules"]
    );
    // Where a rule reads Roles, ours are packed whole (unpacked whole
    // when a plan keeps them).
    watch_whole(&mut w, &gk);
    assert!(
        w.apply(owned(kind, Event::Apply(role("7", json!(["get"])))))
            .dirty
    );
    assert!(w.owned[&id].is_packed());
    assert!(w.unpack([&id]));
    assert_eq!(w.owned[&id].object()["metadata"]["uid"], "u");
    // Others' Roles are kept whole in the store.
    let mut other = role("8", json!(["list"]));
    other["metadata"]["name"] = json!("other");
    other["metadata"]["labels"] = json!({});
    w.apply(owned(kind, Event::Apply(other)));
    let key = ("n".to_string(), "other".to_string());
    assert_eq!(
        w.store.get(&gk, &key).expect("stored")["rules"][0]["verbs"],
        json!(["list"])
    );
}

#[test]
fn a_relist_with_a_changed_body_is_noticed() {
    let mut w = base_world();
    let kind = OutputKind::ClusterRole;
    let id = ObjectId::new(kind, "", "s");
    listed(
        &mut w,
        |e| owned(kind, e),
        vec![served_role("5", json!(["get"]))],
    );
    let desired = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "s", "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
            "annotations": {"rbacrules.io/rule": "r"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "n", "uid": "u-n"}]},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
    assert!(crate::controller::live::differences(&desired, &w.owned[&id]).is_empty());
    // Relisted unchanged: nothing to do, the copy is kept.
    let before = w.owned[&id].clone();
    w.apply(owned(kind, Event::Init));
    let c = w.apply(owned(
        kind,
        Event::InitApply(served_role("5", json!(["get"]))),
    ));
    assert!(!c.dirty);
    w.apply(owned(kind, Event::InitDone));
    assert_eq!(before, w.owned[&id]);
    // Edited while the watch was down: the relist brings the new body,
    // and its digest differs from what is wanted.
    w.apply(owned(kind, Event::Init));
    let c = w.apply(owned(
        kind,
        Event::InitApply(served_role("9", json!(["get", "delete"]))),
    ));
    assert!(c.dirty);
    w.apply(owned(kind, Event::InitDone));
    assert_eq!(w.owned[&id].resource_version(), Some("9"));
    assert_eq!(
        crate::controller::live::differences(&desired, &w.owned[&id]),
        vec!["rules"]
    );
}

#[test]
fn a_relist_keeps_unchanged_copies_and_sweeps_what_is_gone() {
    let mut w = base_world();
    let kind = OutputKind::ClusterRole;
    listed(
        &mut w,
        |e| owned(kind, e),
        vec![
            cluster_role("a", true),
            cluster_role("b", true),
            cluster_role("x", false),
        ],
    );
    let a = ObjectId::new(kind, "", "a");
    let before = w.owned[&a].clone();
    // A relist (after 410 Gone): b was deleted meanwhile, x too.
    w.apply(owned(kind, Event::Init));
    w.apply(owned(kind, Event::InitApply(cluster_role("a", true))));
    // Nothing is removed before the list is complete.
    assert_eq!(w.owned.len(), 2);
    assert!(w.foreign.contains(&ObjectId::new(kind, "", "x")));
    let c = w.apply(owned(kind, Event::InitDone));
    assert!(c.dirty);
    let names: Vec<&str> = w.owned.keys().map(|id| &*id.name).collect();
    assert_eq!(names, vec!["a"]);
    assert!(w.foreign.is_empty());
    // No rule reads ClusterRoles: ours are packed, out of the store.
    assert_eq!(w.store.list(&output_gk(kind)).count(), 0);
    // The unchanged object kept its copy (the plan's memo holds).
    assert_eq!(before, w.owned[&a]);
}

#[test]
fn shed_rules_stay_shed_through_a_relist_of_the_same_version() {
    let mut w = base_world();
    let kind = OutputKind::ClusterRole;
    let mut a = cluster_role("a", true);
    a["metadata"]["uid"] = json!("u-a");
    a["metadata"]["resourceVersion"] = json!("5");
    listed(&mut w, |e| owned(kind, e), vec![a.clone()]);
    let id = ObjectId::new(kind, "", "a");
    // Nothing found equal yet: nothing shed.
    assert_eq!(w.shed_rules(), 0);
    let desired = crate::engine::Manifest::from_value(&a).expect("manifest");
    w.owned[&id].found_equal(&desired);
    assert_eq!(w.shed_rules(), 1);
    assert!(w.owned[&id].rules_shed());
    // The same version listed again keeps the shed copy.
    w.apply(owned(kind, Event::Init));
    w.apply(owned(kind, Event::InitApply(a.clone())));
    w.apply(owned(kind, Event::InitDone));
    assert!(w.owned[&id].rules_shed());
    // A new version is a new copy, whole until a plan finds it equal.
    a["metadata"]["resourceVersion"] = json!("6");
    w.apply(owned(kind, Event::Apply(a.clone())));
    assert!(!w.owned[&id].rules_shed());
    // Unpacked, the shed copy gives back its rules from the desired one.
    let mut l = w.owned[&id].clone();
    l.found_equal(&desired);
    assert!(l.shed_rules() && l.unpack());
    assert_eq!(l.object()["rules"], a["rules"]);
}

#[test]
fn the_deletion_of_an_older_object_keeps_the_one_made_since() {
    let mut w = base_world();
    let kind = OutputKind::ClusterRole;
    let version = |uid: &str, rv: &str| {
        let mut o = cluster_role("x", true);
        o["metadata"]["uid"] = json!(uid);
        o["metadata"]["resourceVersion"] = json!(rv);
        o
    };
    listed(&mut w, |e| owned(kind, e), vec![version("old", "5")]);
    // Re-created: the new copy is learned before the watch reports the
    // deletion of the old one.
    w.apply(Feed::Learned(Learned::Applied(Live::new(version(
        "new", "9",
    )))));
    let c = w.apply(owned(kind, Event::Delete(version("old", "8"))));
    assert!(!c.dirty);
    let id = ObjectId::new(kind, "", "x");
    assert_eq!(w.owned[&id].uid(), Some("new"));
    // Its own deletion removes it.
    w.apply(owned(kind, Event::Delete(version("new", "10"))));
    assert!(w.owned.is_empty());
}

/// Makes the world watch `gk` whole, as when a rule reads its bodies.
fn watch_whole(w: &mut World, gk: &GroupKind) {
    let interest = Interest {
        gk: gk.clone(),
        version: None,
        metadata_only: false,
        fields: None,
        packable: false,
    };
    let epoch = w.next_epoch();
    w.watch_kind(interest, epoch, None);
}

fn tenant_rule(ns: Option<&str>, name: &str) -> RbacRule {
    let mut r = RbacRule::new(
        name,
        serde_json::from_value(json!({"outputs": []})).unwrap(),
    );
    r.metadata.namespace = ns.map(str::to_string);
    r
}

fn list_rules(w: &mut World, tenant: bool, rules: Vec<RbacRule>) {
    let feed = |ev| {
        if tenant {
            Feed::Tenants(Box::new(ev))
        } else {
            Feed::Rules(Box::new(ev))
        }
    };
    w.apply(feed(Event::Init));
    for r in rules {
        w.apply(feed(Event::InitApply(r)));
    }
    w.apply(feed(Event::InitDone));
}

/// A relist of either watch replaces only its own kind's rules, and a
/// tenant rule named like a cluster rule is another rule.
#[test]
fn each_watchs_list_replaces_only_its_own_rules() {
    let mut w = World::new(None);
    list_rules(&mut w, false, vec![tenant_rule(None, "r")]);
    list_rules(
        &mut w,
        true,
        vec![
            tenant_rule(Some("team-a"), "r"),
            tenant_rule(Some("team-b"), "r"),
        ],
    );
    let keys = |w: &World| w.rules.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&w), ["r", "team-a/r", "team-b/r"]);
    list_rules(&mut w, false, vec![]);
    assert_eq!(keys(&w), ["team-a/r", "team-b/r"]);
    list_rules(&mut w, true, vec![tenant_rule(Some("team-b"), "r")]);
    assert_eq!(keys(&w), ["team-b/r"]);
    w.apply(Feed::Tenants(Box::new(Event::Delete(tenant_rule(
        Some("team-b"),
        "r",
    )))));
    assert!(w.rules.is_empty());
}

/// Without the NamespacedRbacRule kind (its CRD not installed), the
/// controller is not held up: the tenant list counts as empty, once.
#[test]
fn an_unserved_tenant_kind_is_an_empty_list() {
    let mut w = World::new(None);
    list_rules(&mut w, false, vec![tenant_rule(None, "r")]);
    let not_found = || {
        let status = kube::core::Status::failure("not found", "NotFound").with_code(404);
        kube::runtime::watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
    };
    let change = w.apply(Feed::Error(Source::Tenants, not_found()));
    assert!(change.rules);
    assert_eq!(w.rules.keys().collect::<Vec<_>>(), ["r"]);
    // The watcher retries with backoff: again 404, no new pass.
    let again = w.apply(Feed::Error(Source::Tenants, not_found()));
    assert!(!again.rules && !again.dirty);
    // Each retry starts with `Init` (kube's watcher goes back to its empty
    // state after a failed list): its failure ends the list, so passes are
    // not held for lists in progress.
    for _ in 0..3 {
        w.apply(Feed::Tenants(Box::new(Event::Init)));
        let retry = w.apply(Feed::Error(Source::Tenants, not_found()));
        assert!(!retry.rules);
        assert!(
            !w.listing(),
            "a failed tenant list is not a list in progress"
        );
    }
}

/// A list of a rule's kind that fails (403: the controller may not list
/// it) ends that list: passes are not held for it, and what the store
/// held stays until a list succeeds.
#[test]
fn a_failed_kind_list_is_not_a_list_in_progress() {
    let mut w = base_world();
    let gk = GroupKind::new("example.org", "Widget");
    watch(&mut w, &gk, 1);
    w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
    w.apply(Feed::Kind(gk.clone(), 1, Event::InitApply(widget("a"))));
    w.apply(Feed::Kind(gk.clone(), 1, Event::InitDone));
    assert!(!w.listing());
    let forbidden = || {
        let status = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        kube::runtime::watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
    };
    for _ in 0..3 {
        w.apply(Feed::Kind(gk.clone(), 1, Event::Init));
        assert!(w.listing());
        w.apply(Feed::Error(Source::Kind(gk.clone(), 1), forbidden()));
        assert!(!w.listing(), "a failed list is not a list in progress");
        assert_eq!(w.store.list(&gk).count(), 1);
    }
}
