//! Where each watch stands in its list: a list in progress, done, or
//! failed ([`Listing`]), and the state of the watch on one kind the rules
//! read ([`KindWatch`]). Plain data: the [`super::World`] reads and moves it.

use std::collections::BTreeSet;

use kube::runtime::watcher::{self, Event};
use serde_json::Value;

use crate::engine::Interest;

/// Progress of one watch's list.
#[derive(Debug)]
pub(super) struct Listing<T> {
    /// A complete list has been received and no list failed since.
    pub(super) synced: bool,
    /// The last list error.
    pub(super) error: Option<String>,
    /// Objects of a list in progress.
    pub(super) buffer: Option<Vec<T>>,
}

/// What applying an event means for the control loop.
pub(super) enum Step<T> {
    /// Nothing to do yet (list in progress).
    Nothing,
    /// One object added or changed.
    Upsert(T),
    /// One object removed.
    Remove(T),
    /// A complete list replaces everything.
    Replace(Vec<T>),
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Listing {
            synced: false,
            error: None,
            buffer: None,
        }
    }
}

impl<T> Listing<T> {
    pub(super) fn step(&mut self, event: Event<T>) -> Step<T> {
        match event {
            Event::Init => {
                self.buffer = Some(Vec::new());
                Step::Nothing
            }
            Event::InitApply(o) => {
                self.buffer.get_or_insert_with(Vec::new).push(o);
                Step::Nothing
            }
            Event::InitDone => {
                self.synced = true;
                self.error = None;
                Step::Replace(self.buffer.take().unwrap_or_default())
            }
            Event::Apply(o) => Step::Upsert(o),
            Event::Delete(o) => Step::Remove(o),
        }
    }

    /// Records a watch error. Only a failed list makes the cache stale: a
    /// failed watch resumes from its resourceVersion, and a 410 re-lists.
    pub(super) fn fail(&mut self, error: &watcher::Error) {
        if let watcher::Error::InitialListFailed(e) = error {
            self.synced = false;
            self.error = Some(e.to_string());
            // The failed list is no longer in progress: kube's watcher
            // starts its retry with a new `Init`. Kept, it would hold
            // every pass in `World::listing` for as long as the list fails
            // (a NamespacedRbacRule CRD not installed: forever).
            self.buffer = None;
        }
    }
}

/// Whether a list failed because the kind is not served (404).
pub(super) fn not_found(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

/// State of the watch on one kind the rules read.
#[derive(Debug)]
pub(super) struct KindWatch {
    pub(super) interest: Interest,
    /// Why there is no watch (not served, discovery failed), if there is none.
    pub(super) unresolved: Option<String>,
    pub(super) epoch: u64,
    pub(super) listing: Listing<Value>,
    /// While a list is in progress, the objects it held so far.
    pub(super) seen: Option<BTreeSet<crate::engine::store::ObjectKey>>,
    /// Whether a watch runs (its task lives in [`crate::controller::watch::Watches`]).
    pub(super) watching: bool,
}

pub(in crate::controller) fn map_event<A, B>(ev: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}
