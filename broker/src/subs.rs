//! The registry of WebSocket sessions and their subscriptions, indexed so
//! that a notification finds its recipients without looking at anyone else.
//!
//! A subscription is `(pipe, session, sub)`: the listener pipe that holds
//! the session, the session's number in that listener process, and the
//! subscription's number in the session. Exact patterns are indexed by event
//! type id; wildcard patterns (`order.*`, `*`) by their prefix, and a
//! notification named `a.b.c` looks up only the prefixes `""`, `a.`, `a.b.`:
//! one hash lookup per dot in its name, whatever the number of clients.
//! Filters are evaluated only for subscriptions the index already matched,
//! against the body parsed once per notification.

use std::collections::{BTreeMap, HashMap, HashSet};

use switchyard_proto::EventType;
use switchyard_proto::control::{Filter, pattern_prefix};

/// One subscription's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SubKey {
    pub(crate) pipe: u64,
    pub(crate) session: u64,
    pub(crate) sub: u64,
}

enum Indexed {
    Exact(EventType),
    Prefix(String),
}

struct Entry {
    indexed: Indexed,
    filter: Option<Filter>,
}

#[derive(Default)]
pub(crate) struct Subscriptions {
    entries: HashMap<SubKey, Entry>,
    exact: HashMap<EventType, HashSet<SubKey>>,
    prefixes: HashMap<String, HashSet<SubKey>>,
    /// pipe → session → its subscriptions, to drop sessions and pipes whole.
    by_pipe: HashMap<u64, HashMap<u64, HashSet<u64>>>,
}

/// Recipients of one notification, grouped by pipe: `(session, sub)` pairs.
pub(crate) type Recipients = BTreeMap<u64, Vec<(u64, u64)>>;

impl Subscriptions {
    /// Adds (or replaces) a subscription; the error says why it is refused.
    pub(crate) fn subscribe(&mut self, key: SubKey, pattern: &str, filter_json: &str) -> Result<(), String> {
        let indexed = match pattern_prefix(pattern)? {
            Some(prefix) => Indexed::Prefix(prefix.to_owned()),
            None => Indexed::Exact(EventType::of(pattern)),
        };
        let filter = if filter_json.is_empty() {
            None
        } else {
            Some(Filter::parse_str(filter_json)?)
        };
        self.unsubscribe(key);
        match &indexed {
            Indexed::Exact(ty) => self.exact.entry(*ty).or_default().insert(key),
            Indexed::Prefix(p) => self.prefixes.entry(p.clone()).or_default().insert(key),
        };
        self.by_pipe
            .entry(key.pipe)
            .or_default()
            .entry(key.session)
            .or_default()
            .insert(key.sub);
        self.entries.insert(key, Entry { indexed, filter });
        Ok(())
    }

    pub(crate) fn unsubscribe(&mut self, key: SubKey) {
        let Some(entry) = self.entries.remove(&key) else {
            return;
        };
        match entry.indexed {
            Indexed::Exact(ty) => remove_from(&mut self.exact, &ty, &key),
            Indexed::Prefix(p) => remove_from(&mut self.prefixes, &p, &key),
        }
        if let Some(sessions) = self.by_pipe.get_mut(&key.pipe) {
            if let Some(subs) = sessions.get_mut(&key.session) {
                subs.remove(&key.sub);
                if subs.is_empty() {
                    sessions.remove(&key.session);
                }
            }
            if sessions.is_empty() {
                self.by_pipe.remove(&key.pipe);
            }
        }
    }

    /// Drops every subscription of a session.
    pub(crate) fn close_session(&mut self, pipe: u64, session: u64) {
        let subs: Vec<u64> = self
            .by_pipe
            .get(&pipe)
            .and_then(|s| s.get(&session))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for sub in subs {
            self.unsubscribe(SubKey { pipe, session, sub });
        }
    }

    /// Drops every session held by a pipe (the pipe closed).
    pub(crate) fn close_pipe(&mut self, pipe: u64) {
        let sessions: Vec<u64> = self
            .by_pipe
            .get(&pipe)
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default();
        for session in sessions {
            self.close_session(pipe, session);
        }
    }

    /// Subscriptions held (`/metrics`).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The subscriptions a notification of type `ty` (named `name`, when the
    /// sender named it) with JSON `body` reaches, grouped by pipe.
    pub(crate) fn recipients(&self, ty: EventType, name: Option<&str>, body: &[u8]) -> Recipients {
        let mut candidates: Vec<SubKey> = Vec::new();
        if let Some(set) = self.exact.get(&ty) {
            candidates.extend(set.iter().copied());
        }
        if !self.prefixes.is_empty() {
            // A name that hashes to another type is not this notification's.
            if let Some(name) = name.filter(|n| EventType::of(n) == ty) {
                let cuts = std::iter::once(0).chain(name.match_indices('.').map(|(i, _)| i + 1));
                for cut in cuts {
                    if let Some(set) = self.prefixes.get(&name[..cut]) {
                        candidates.extend(set.iter().copied());
                    }
                }
            }
        }
        let mut out = Recipients::new();
        if candidates.is_empty() {
            return out;
        }
        // Parsed once, and only when some candidate filters.
        let mut parsed: Option<Option<serde_json::Value>> = None;
        for key in candidates {
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            if let Some(filter) = &entry.filter {
                let body = parsed.get_or_insert_with(|| serde_json::from_slice(body).ok());
                if !body.as_ref().is_some_and(|b| filter.matches(b)) {
                    continue;
                }
            }
            out.entry(key.pipe).or_default().push((key.session, key.sub));
        }
        out
    }
}

fn remove_from<K: std::hash::Hash + Eq>(map: &mut HashMap<K, HashSet<SubKey>>, k: &K, key: &SubKey) {
    if let Some(set) = map.get_mut(k) {
        set.remove(key);
        if set.is_empty() {
            map.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pipe: u64, session: u64, sub: u64) -> SubKey {
        SubKey { pipe, session, sub }
    }

    fn hits(s: &Subscriptions, name: &str, body: &str) -> Vec<(u64, u64, u64)> {
        let mut v: Vec<_> = s
            .recipients(EventType::of(name), Some(name), body.as_bytes())
            .into_iter()
            .flat_map(|(pipe, list)| list.into_iter().map(move |(se, su)| (pipe, se, su)))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn exact_prefix_and_everything() {
        let mut s = Subscriptions::default();
        s.subscribe(key(1, 1, 1), "order.created", "").unwrap();
        s.subscribe(key(1, 2, 1), "order.*", "").unwrap();
        s.subscribe(key(2, 1, 1), "*", "").unwrap();
        s.subscribe(key(2, 1, 2), "demo.tick", "").unwrap();
        s.subscribe(key(2, 2, 1), "order.created.*", "").unwrap();
        assert_eq!(
            hits(&s, "order.created", "{}"),
            vec![(1, 1, 1), (1, 2, 1), (2, 1, 1)]
        );
        assert_eq!(hits(&s, "order.updated", "{}"), vec![(1, 2, 1), (2, 1, 1)]);
        assert_eq!(
            hits(&s, "order.created.eu", "{}"),
            vec![(1, 2, 1), (2, 1, 1), (2, 2, 1)]
        );
        assert_eq!(hits(&s, "demo.tick", "{}"), vec![(2, 1, 1), (2, 1, 2)]);
        assert_eq!(hits(&s, "orders", "{}"), vec![(2, 1, 1)]);
        // Without a name only exact subscriptions can match.
        let r = s.recipients(EventType::of("demo.tick"), None, b"{}");
        assert_eq!(r.get(&2), Some(&vec![(1, 2)]));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn filters_narrow_matches() {
        let mut s = Subscriptions::default();
        s.subscribe(key(1, 1, 1), "order.created", r#"{"customer_id":42}"#)
            .unwrap();
        s.subscribe(key(1, 2, 1), "order.*", r#"{"qty":{"gt":2}}"#)
            .unwrap();
        s.subscribe(key(1, 3, 1), "order.*", "").unwrap();
        let body = r#"{"customer_id":42,"qty":1}"#;
        assert_eq!(hits(&s, "order.created", body), vec![(1, 1, 1), (1, 3, 1)]);
        let body = r#"{"customer_id":7,"qty":5}"#;
        assert_eq!(hits(&s, "order.created", body), vec![(1, 2, 1), (1, 3, 1)]);
        // A body that is not JSON fails every filter, not the unfiltered.
        assert_eq!(hits(&s, "order.created", "\u{1}\u{2}"), vec![(1, 3, 1)]);
        assert!(
            s.subscribe(key(1, 4, 1), "order.*", r#"{"qty":{"like":1}}"#)
                .is_err()
        );
        assert!(s.subscribe(key(1, 4, 1), "order*", "").is_err());
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn unsubscribe_sessions_and_pipes_leave_nothing() {
        let mut s = Subscriptions::default();
        for pipe in 1..=3 {
            for session in 1..=10 {
                s.subscribe(key(pipe, session, 1), "order.*", "").unwrap();
                s.subscribe(key(pipe, session, 2), "demo.tick", "").unwrap();
                // Replacing a subscription keeps one entry.
                s.subscribe(key(pipe, session, 2), "demo.tick", "").unwrap();
            }
        }
        assert_eq!(s.len(), 60);
        s.unsubscribe(key(1, 1, 1));
        assert_eq!(hits(&s, "order.x", "{}").len(), 29);
        s.close_session(1, 2);
        assert_eq!(hits(&s, "order.x", "{}").len(), 28);
        assert_eq!(hits(&s, "demo.tick", "{}").len(), 29);
        s.close_pipe(2);
        assert_eq!(hits(&s, "demo.tick", "{}").len(), 19);
        s.close_pipe(1);
        s.close_pipe(3);
        assert_eq!(s.len(), 0);
        assert!(s.exact.is_empty() && s.prefixes.is_empty() && s.by_pipe.is_empty());
    }
}
