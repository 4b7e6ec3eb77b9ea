//! The router's state: who serves what, and which requests are in flight.

use std::collections::{BTreeMap, HashMap, HashSet};

use switchyard_proto::control::{
    ClusterLink, Control, DeclaredType, HandledType, LinkState, META_EVENT, ManagerDescription,
    ManagerHealth, RequestNeeds, RouteEntry, RouteTable, TypeNeeds,
};
use switchyard_proto::remote::{MANIFEST_EXPIRY, Manifest, REMOTE_ID as BRIDGE_ID, ToRemote};
use switchyard_proto::transport::FrameSink;
use switchyard_proto::{Deadline, Envelope, EventType, Hop, Origin, Refusal};
use tokio::sync::mpsc;

/// The responder of a client's job sent to the listeners (decision
/// 0113): their answers come from the broker, never from a manager
/// instance (those count up from 1) or the bridge.
pub(crate) const LISTENERS_ID: u64 = u64::MAX - 1;

struct Instance {
    name: String,
    sink: FrameSink,
    /// Requests sent to this instance and not answered yet.
    outstanding: u32,
    /// Being replaced: gets no new work, finishes what it has.
    draining: bool,
    /// The request types it declared, with their routes: what no other
    /// manager may declare while it is connected.
    handles: Vec<(EventType, Option<(String, String)>)>,
    /// Responses it sent for requests it was not sent; only the first is
    /// logged as a warning.
    refused_responses: u64,
    /// Whether it was told about (logged for) stripped request context.
    stripped_logged: bool,
}

struct Known {
    type_name: String,
    manager: String,
    /// Clients may send it (decision 0108).
    public: bool,
}

/// The link to the other groups and what they declared.
struct Cluster {
    /// The router's end of the port to the link ([`crate::remote`]).
    port: mpsc::Sender<ToRemote>,
    /// Types sent through NATS even when served here (`cluster.shared`).
    shared: HashSet<EventType>,
    /// Each other group's manifest, by its id, and when it last came:
    /// their routes are served here too, their types are worth a call.
    /// On tokio's clock, so paused time moves it (decision 0151).
    remote: BTreeMap<String, (Manifest, tokio::time::Instant)>,
    link: ClusterLink,
    /// What this group last told the cluster it serves.
    told: Option<Manifest>,
    /// The remote managers (`manager@group`) of groups that left, newest
    /// last and at most [`MAX_DEPARTED`]: listeners are told to forget
    /// their routes (they keep a route until told).
    departed: std::collections::VecDeque<String>,
}

/// Most request types, routes and request needs one other group's
/// manifest may bring; past them the rest is ignored (and logged).
pub(crate) const MAX_REMOTE_TYPES: usize = 4096;
pub(crate) const MAX_REMOTE_ROUTES: usize = 1024;
/// Most other groups heard from at once; a group past it is ignored
/// until one leaves.
pub(crate) const MAX_REMOTE_GROUPS: usize = 64;
/// Departed groups' managers listeners are still told to forget.
const MAX_DEPARTED: usize = 256;

/// A manifest as this router keeps it: bounded, and its routes named
/// `manager@group`, so that no remote manager is ever mistaken for a local
/// one of the same name and a departed group's routes can be retired by
/// name. Returns whether anything was cut.
pub(crate) fn bounded(group: &str, mut manifest: Manifest) -> (Manifest, bool) {
    let cut = manifest.serves.len() > MAX_REMOTE_TYPES
        || manifest.routes.len() > MAX_REMOTE_ROUTES
        || manifest.needs.len() > MAX_REMOTE_TYPES;
    while manifest.serves.len() > MAX_REMOTE_TYPES {
        manifest.serves.pop_last();
    }
    manifest.routes.truncate(MAX_REMOTE_ROUTES);
    manifest.needs.truncate(MAX_REMOTE_TYPES);
    for entry in &mut manifest.routes {
        entry.manager = format!("{}@{group}", entry.manager);
    }
    (manifest, cut)
}

/// Whether `path` would take requests from the routes in `taken`: it
/// conflicts with one of them (same shape), or, taken literally, one of
/// them already matches it (a static `/a/b` under `/a/{x}`).
fn shadows(taken: &mut matchit::Router<()>, path: &str) -> bool {
    taken.at(path).is_ok() || taken.insert(path, ()).is_err()
}

/// The routes of other groups that listeners here may serve, in group
/// order: none for a type this group serves itself, none that would take
/// requests from a local route (or from another group's route taken
/// first). `local` is every local route, kept while its manager is down.
pub(crate) fn remote_routes<'a>(
    local: impl IntoIterator<Item = &'a RouteEntry>,
    local_types: &HashSet<EventType>,
    remote: impl IntoIterator<Item = &'a Manifest>,
) -> Vec<RouteEntry> {
    let mut taken: HashMap<String, matchit::Router<()>> = HashMap::new();
    for entry in local {
        // Local routes may overlap each other (the listener sorts that
        // out); what matters is that remote ones stay off all of them.
        let _ = taken
            .entry(entry.route.method.clone())
            .or_default()
            .insert(entry.route.path.clone(), ());
    }
    let mut accepted = Vec::new();
    for manifest in remote {
        for entry in &manifest.routes {
            if local_types.contains(&entry.event_type) {
                continue;
            }
            let router = taken.entry(entry.route.method.clone()).or_default();
            if !shadows(router, &entry.route.path) {
                accepted.push(entry.clone());
            }
        }
    }
    accepted
}

impl Cluster {
    /// A departed group's managers: listeners are told to forget them.
    fn forget(&mut self, manifest: &Manifest) {
        for entry in &manifest.routes {
            if !self.departed.contains(&entry.manager) {
                self.departed.push_back(entry.manager.clone());
            }
        }
        while self.departed.len() > MAX_DEPARTED {
            self.departed.pop_front();
        }
    }
}

struct InFlight {
    instance: u64,
    deadline: Deadline,
}

pub(crate) struct Table {
    instances: HashMap<u64, Instance>,
    /// Request type → instances answering it, in registration order.
    handlers: HashMap<EventType, Vec<u64>>,
    /// Notification type → subscribed instances.
    subscribers: HashMap<EventType, Vec<u64>>,
    /// Round-robin cursor per type, to break least-outstanding ties.
    cursor: HashMap<EventType, usize>,
    /// Every type ever registered, with its manager's name: a request for a
    /// known type whose manager is down gets 503, an unknown one 404.
    known: HashMap<EventType, Known>,
    /// Keyed by the requester's return address and correlation id.
    in_flight: HashMap<(Origin, u64), InFlight>,
    /// Every route ever declared; routes of a manager that is down stay, so
    /// the listener answers 503 for them, not 404.
    routes: BTreeMap<(String, String), RouteEntry>,
    /// What each request type declares it reads of its request; kept,
    /// like the routes, while its manager is down.
    needs: BTreeMap<EventType, RequestNeeds>,
    /// The notification types managers subscribe to or emit, by name,
    /// with whether clients may send them; kept like the routes.
    notifications: BTreeMap<EventType, DeclaredType>,
    declared: Vec<String>,
    /// Managers that have registered an instance since the router started:
    /// once every declared one has, `known` holds every type the group
    /// serves.
    registered: HashSet<String>,
    /// Managers removed by a reload whose last instance has gone: their
    /// routes are forgotten, by the listeners too.
    retired: std::collections::BTreeSet<String>,
    broker: Option<FrameSink>,
    /// The other groups, with `[cluster]` on.
    cluster: Option<Cluster>,
    version: u64,
    next_id: u64,
    max_outstanding: u32,
}

impl Table {
    pub(crate) fn new(declared: Vec<String>, max_outstanding: u32) -> Table {
        Table {
            instances: HashMap::new(),
            handlers: HashMap::new(),
            subscribers: HashMap::new(),
            cursor: HashMap::new(),
            known: HashMap::new(),
            in_flight: HashMap::new(),
            routes: BTreeMap::new(),
            needs: BTreeMap::new(),
            notifications: BTreeMap::new(),
            declared,
            registered: HashSet::new(),
            retired: Default::default(),
            broker: None,
            cluster: None,
            version: 0,
            next_id: 0,
            max_outstanding,
        }
    }

    pub(crate) fn set_broker(&mut self, broker: Option<FrameSink>) {
        if broker.is_none() {
            // Responses to listener pipes can no longer be delivered.
            self.in_flight.retain(|(origin, _), flight| {
                let keep = !matches!(origin, Origin::Pipe(_));
                if !keep && let Some(inst) = self.instances.get_mut(&flight.instance) {
                    inst.outstanding = inst.outstanding.saturating_sub(1);
                }
                keep
            });
            // Jobs a listener was admitting: their answer cannot come.
            let jobs: Vec<(Origin, u64)> = self
                .in_flight
                .iter()
                .filter(|(_, f)| f.instance == LISTENERS_ID)
                .map(|(k, _)| *k)
                .collect();
            for key in jobs {
                self.in_flight.remove(&key);
                self.deliver(
                    Refusal::new(
                        Hop::Router,
                        503,
                        "the broker went away while a listener admitted the job",
                    )
                    .answer(&stub_request(key.0, key.1)),
                );
            }
        }
        self.broker = broker;
        self.publish();
    }

    /// Registers a connected instance; refuses a type-id collision.
    pub(crate) fn add_instance(
        &mut self,
        description: ManagerDescription,
        sink: FrameSink,
    ) -> Result<u64, String> {
        for HandledType {
            name,
            event_type,
            route,
            ..
        } in &description.handles
        {
            if let Some(known) = self.known.get(event_type)
                && known.type_name != *name
            {
                return Err(format!("event type `{name}` collides with `{}`", known.type_name));
            }
            if let Some(owner) = self.type_owner(*event_type, &description.name) {
                return Err(format!("event type `{name}` is declared by manager `{owner}`"));
            }
            if let Some(route) = route
                && let Some(owner) = self.route_owner(&route.method, &route.path, &description.name)
            {
                return Err(format!(
                    "route `{} {}` is declared by manager `{owner}`",
                    route.method, route.path
                ));
            }
        }
        self.next_id += 1;
        let id = self.next_id;
        for handled in &description.handles {
            self.handlers.entry(handled.event_type).or_default().push(id);
            self.known.insert(
                handled.event_type,
                Known {
                    type_name: handled.name.clone(),
                    manager: description.name.clone(),
                    public: handled.public,
                },
            );
            if handled.needs.is_empty() {
                self.needs.remove(&handled.event_type);
            } else {
                self.needs.insert(handled.event_type, handled.needs.clone());
            }
            if let Some(route) = &handled.route {
                self.routes.insert(
                    (route.method.clone(), route.path.clone()),
                    RouteEntry {
                        route: route.clone(),
                        event_type: handled.event_type,
                        type_name: handled.name.clone(),
                        manager: description.name.clone(),
                    },
                );
            }
        }
        for sub in &description.subscribes {
            self.subscribers.entry(*sub).or_default().push(id);
        }
        for declared in &description.notifications {
            self.notifications.insert(declared.event_type, declared.clone());
        }
        self.registered.insert(description.name.clone());
        self.retired.remove(&description.name);
        let handles = description
            .handles
            .iter()
            .map(|h| {
                let route = h.route.as_ref().map(|r| (r.method.clone(), r.path.clone()));
                (h.event_type, route)
            })
            .collect();
        self.instances.insert(
            id,
            Instance {
                name: description.name.clone(),
                sink,
                outstanding: 0,
                draining: false,
                handles,
                refused_responses: 0,
                stripped_logged: false,
            },
        );
        self.publish();
        Ok(id)
    }

    /// The manager other than `name` that owns request type `ty`: one with
    /// a connected instance declaring it, or, while it has no instance
    /// (restarting), the declared manager that last did — so a type cannot
    /// be taken in the moment its manager is down. A manager whose running
    /// instances no longer declare a type has given it up.
    fn type_owner(&self, ty: EventType, name: &str) -> Option<String> {
        if let Some(inst) = self
            .instances
            .values()
            .find(|i| i.name != name && i.handles.iter().any(|(t, _)| *t == ty))
        {
            return Some(inst.name.clone());
        }
        let known = self.known.get(&ty)?;
        self.held_while_down(&known.manager, name)
    }

    /// As [`Table::type_owner`], for the route `method path`: owned by the
    /// manager of any route it would take requests from ([`shadows`]), not
    /// only one of the same text (`/hello/{who}` would take
    /// `/hello/{name}`'s requests at the listener).
    fn route_owner(&self, method: &str, path: &str, name: &str) -> Option<String> {
        let takes = |other: &str| {
            let mut taken = matchit::Router::new();
            taken.insert(other, ()).is_ok() && shadows(&mut taken, path)
        };
        for inst in self.instances.values().filter(|i| i.name != name) {
            for (_, route) in &inst.handles {
                if let Some((m, p)) = route
                    && m == method
                    && takes(p)
                {
                    return Some(inst.name.clone());
                }
            }
        }
        self.routes
            .values()
            .filter(|e| e.route.method == method && takes(&e.route.path))
            .find_map(|e| self.held_while_down(&e.manager, name))
    }

    /// `owner`, when it is another declared manager with no instance up.
    fn held_while_down(&self, owner: &str, name: &str) -> Option<String> {
        let down = owner != name
            && self.declared.iter().any(|d| d == owner)
            && !self.instances.values().any(|i| i.name == owner);
        down.then(|| owner.to_owned())
    }

    /// Instance `id` sent request context only the listener sets: it was
    /// stripped (logged once per instance).
    pub(crate) fn stripped_context(&mut self, id: u64, count: usize) {
        let Some(inst) = self.instances.get_mut(&id) else {
            return;
        };
        if !inst.stripped_logged {
            inst.stripped_logged = true;
            tracing::warn!(
                manager = %inst.name,
                instance = id,
                count,
                "stripped listener-only request context (`:` meta keys such as `:identity`) from what this manager sent; only the listener sets it"
            );
        }
    }

    /// Removes a disconnected instance and answers its requests in flight
    /// with 503. Returns how many were failed.
    pub(crate) fn remove_instance(&mut self, id: u64) -> usize {
        let Some(inst) = self.instances.remove(&id) else {
            return 0;
        };
        for list in self.handlers.values_mut().chain(self.subscribers.values_mut()) {
            list.retain(|&i| i != id);
        }
        let lost: Vec<(Origin, u64)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.instance == id)
            .map(|(k, _)| *k)
            .collect();
        if !self.declared.contains(&inst.name) && !self.instances.values().any(|i| i.name == inst.name) {
            self.forget(&inst.name);
        }
        let refusal = Refusal::new(
            Hop::Router,
            503,
            format!("manager `{}` went down while handling the request", inst.name),
        );
        for key in &lost {
            if self.in_flight.remove(key).is_some() {
                let stub = stub_request(key.0, key.1);
                self.deliver(refusal.answer(&stub));
            }
        }
        self.publish();
        lost.len()
    }

    /// The managers the group now declares. One no longer declared, with
    /// no instance left, takes its routes and types with it.
    pub(crate) fn set_declared(&mut self, declared: Vec<String>) {
        self.declared = declared;
        let live: HashSet<&String> = self.instances.values().map(|i| &i.name).collect();
        let gone: Vec<String> = self
            .registered
            .iter()
            .filter(|m| !live.contains(m) && !self.declared.contains(m))
            .cloned()
            .collect();
        for manager in gone {
            self.forget(&manager);
        }
        self.publish();
    }

    /// A manager removed from the group and gone: its routes answer 404,
    /// its types are unknown.
    fn forget(&mut self, manager: &str) {
        self.routes.retain(|_, entry| entry.manager != manager);
        self.known.retain(|_, known| known.manager != manager);
        self.registered.remove(manager);
        self.retired.insert(manager.to_owned());
    }

    /// Takes a draining instance out of routing: no new request or
    /// notification goes to it; responses from it and to its own calls
    /// still flow until it disconnects.
    pub(crate) fn drain_instance(&mut self, id: u64) {
        let Some(inst) = self.instances.get_mut(&id) else {
            return;
        };
        inst.draining = true;
        for list in self.handlers.values_mut().chain(self.subscribers.values_mut()) {
            list.retain(|&i| i != id);
        }
        self.publish();
    }

    /// Sends a request to one instance, or answers it at once.
    pub(crate) fn route_request(&mut self, env: Envelope) {
        if let Some((status, detail)) = self.misnamed(&env) {
            tracing::warn!(
                request_id = env.context.request_id_field(),
                origin = ?env.origin,
                status,
                %detail,
                "request refused: its name is not its type's"
            );
            return self.deliver(Refusal::new(Hop::Router, status, detail).answer(&env));
        }
        if self.goes_remote(&env) {
            return self.route_remote(env);
        }
        let key = (env.origin, env.correlation);
        let Some(id) = self.pick(env.event_type) else {
            let (status, detail) = self.unroutable(&env);
            tracing::debug!(request_id = env.context.request_id_field(), trace_id = env.context.trace_id_field(), status, %detail, "request not routed");
            let mut refusal = Refusal::new(Hop::Router, status, detail);
            if status == 503 {
                // Its manager is restarting (or crash-looping): come back.
                refusal = refusal.retry_after(1);
            }
            return self.deliver(refusal.answer(&env));
        };
        let inst = self.instances.get_mut(&id).expect("picked instances exist");
        tracing::debug!(
            request_id = env.context.request_id_field(), trace_id = env.context.trace_id_field(),
            manager = %inst.name,
            instance = id,
            "request routed"
        );
        if inst.outstanding >= self.max_outstanding {
            tracing::debug!(request_id = env.context.request_id_field(), trace_id = env.context.trace_id_field(), manager = %inst.name, "manager at capacity");
            let refusal =
                Refusal::unavailable(Hop::Router, format!("manager `{}` is at capacity", inst.name));
            return self.deliver(refusal.answer(&env));
        }
        let deadline = env.deadline;
        match inst.sink.send(env) {
            Ok(()) => {
                inst.outstanding += 1;
                self.in_flight.insert(
                    key,
                    InFlight {
                        instance: id,
                        deadline,
                    },
                );
            }
            Err(refused) => {
                tracing::debug!(
                    request_id = refused.envelope.context.request_id_field(), trace_id = refused.envelope.context.trace_id_field(),
                    manager = %inst.name,
                    "manager not keeping up; request refused"
                );
                let mut refusal = Refusal::new(
                    Hop::Router,
                    503,
                    format!("manager `{}` is not keeping up", inst.name),
                );
                if refused.full {
                    refusal = refusal.retry_after(1);
                }
                self.deliver(refusal.answer(&refused.envelope));
            }
        }
    }

    /// A client's job from the built-in Scheduler (meta
    /// [`META_JOB`](switchyard_proto::control::META_JOB)): to the broker,
    /// which hands it to one listener; the listener admits it as the
    /// client and sends it on as the client's own. A request stays in
    /// flight here, answered by the listener (or 504 at its deadline); a
    /// notification is not fanned out from here at all, only from the
    /// listener once admitted (decision 0113).
    pub(crate) fn route_job(&mut self, env: Envelope) {
        let Some(broker) = &self.broker else {
            if env.kind == switchyard_proto::Kind::Request {
                self.deliver(
                    Refusal::unavailable(Hop::Router, "no listener is connected to admit the job")
                        .answer(&env),
                );
            } else {
                tracing::warn!("a client's notification job dropped: no listener is connected");
            }
            return;
        };
        let key = (env.origin, env.correlation);
        let (request, deadline) = (env.kind == switchyard_proto::Kind::Request, env.deadline);
        match broker.send(env) {
            Ok(()) if request => {
                self.in_flight.insert(
                    key,
                    InFlight {
                        instance: LISTENERS_ID,
                        deadline,
                    },
                );
            }
            Ok(()) => {}
            Err(refused) if request => {
                self.deliver(
                    Refusal::unavailable(Hop::Router, "the broker is not keeping up")
                        .answer(&refused.envelope),
                );
            }
            Err(refused) => tracing::warn!(%refused, "a client's notification job dropped"),
        }
    }

    /// A request whose name (meta `event`, set when a client named its
    /// type) is not the name of the type its id routes to: 400 when the id
    /// is not even the name's hash, 404 when it is but another type holds
    /// that id (a collision: the name is declared by nobody). Types are
    /// routed by a 64-bit hash that is cheap to collide on purpose, while
    /// rules are written on names; this is where the two must agree.
    fn misnamed(&self, env: &Envelope) -> Option<(u16, String)> {
        let name = env.meta.get(META_EVENT)?;
        if EventType::of(name) != env.event_type {
            return Some((
                400,
                format!("event type `{name}` does not match the type id it was sent with"),
            ));
        }
        let known = self.known.get(&env.event_type)?;
        (known.type_name != name).then(|| (404, format!("no manager declares event type `{name}`")))
    }

    /// Whether a request goes to the other groups: local managers first
    /// (docs/cluster.md#routing), so only a type no local instance takes
    /// now, or a shared one while the link is up; and one some group has
    /// declared, so a type nobody serves is still a 404. A request that
    /// came from the cluster never goes back to it.
    fn goes_remote(&self, env: &Envelope) -> bool {
        let Some(cluster) = &self.cluster else {
            return false;
        };
        if env.origin == Origin::Manager(BRIDGE_ID) {
            return false;
        }
        let ty = env.event_type;
        if cluster.shared.contains(&ty) && cluster.link.state == LinkState::Connected {
            return true;
        }
        let local = self.handlers.get(&ty).is_some_and(|l| !l.is_empty());
        !local && cluster.remote.values().any(|(m, _)| m.serves.contains(&ty))
    }

    /// Hands a request to the bridge, which always answers it; in flight
    /// here too, so its deadline holds even if the bridge is slow.
    fn route_remote(&mut self, env: Envelope) {
        let Some(cluster) = &self.cluster else { return };
        let key = (env.origin, env.correlation);
        let deadline = env.deadline;
        if cluster.link.state != LinkState::Connected {
            let refusal = Refusal::unavailable(
                Hop::Cluster,
                "the cluster link is down; no other group can be reached",
            );
            return self.deliver(refusal.answer(&env));
        }
        tracing::debug!(
            request_id = env.context.request_id_field(),
            "request routed to the cluster"
        );
        match cluster
            .port
            .try_send(ToRemote::Request(env))
            .map_err(|e| e.into_inner())
        {
            Ok(()) => {
                self.in_flight.insert(
                    key,
                    InFlight {
                        instance: BRIDGE_ID,
                        deadline,
                    },
                );
            }
            Err(frame) => {
                if let ToRemote::Request(env) = frame {
                    self.deliver(
                        Refusal::unavailable(Hop::Cluster, "the cluster bridge is not keeping up")
                            .answer(&env),
                    );
                }
            }
        }
    }

    pub(crate) fn set_cluster(&mut self, port: mpsc::Sender<ToRemote>, shared: HashSet<EventType>) {
        let link = ClusterLink {
            state: LinkState::Connecting,
            peers: 0,
        };
        switchyard_proto::supervision::GAUGES.set_cluster(link);
        self.cluster = Some(Cluster {
            port,
            shared,
            remote: BTreeMap::new(),
            link,
            told: None,
            departed: Default::default(),
        });
        self.publish();
    }

    /// Another group's routes and types, bounded ([`bounded`]).
    pub(crate) fn set_remote(&mut self, group: String, manifest: Manifest) {
        let Some(cluster) = &mut self.cluster else { return };
        let now = tokio::time::Instant::now();
        let (manifest, cut) = bounded(&group, manifest);
        if let Some((known, seen)) = cluster.remote.get_mut(&group)
            && *known == manifest
        {
            *seen = now;
            return;
        }
        if !cluster.remote.contains_key(&group) && cluster.remote.len() >= MAX_REMOTE_GROUPS {
            return tracing::warn!(
                %group,
                max = MAX_REMOTE_GROUPS,
                "another group's manifest ignored: this group already hears from as many groups as it keeps"
            );
        }
        if !cluster.remote.contains_key(&group) {
            // Back after it was given up for gone: its routes are live again.
            let suffix = format!("@{group}");
            cluster.departed.retain(|m| !m.ends_with(&suffix));
        }
        // A manager the group no longer lists (stopped there, or the group
        // is stopping one manager after another) is retired at the
        // listeners like a departed group's: they would keep its routes
        // for good otherwise. One it lists again is live again.
        let live: HashSet<String> = manifest.routes.iter().map(|e| e.manager.clone()).collect();
        cluster.departed.retain(|m| !live.contains(m));
        if let Some((old, _)) = cluster.remote.get(&group) {
            let gone = Manifest {
                routes: old
                    .routes
                    .iter()
                    .filter(|e| !live.contains(&e.manager))
                    .cloned()
                    .collect(),
                ..Manifest::default()
            };
            cluster.forget(&gone);
        }
        if cut {
            tracing::warn!(
                %group,
                max_types = MAX_REMOTE_TYPES,
                max_routes = MAX_REMOTE_ROUTES,
                "another group declares more than a group may; the rest of its manifest is ignored"
            );
        }
        cluster.remote.insert(group, (manifest, now));
        self.cluster_changed();
    }

    /// Another group said goodbye (a clean stop): its routes and types are
    /// forgotten now, as after `MANIFEST_EXPIRY` for one that went silent.
    pub(crate) fn remote_left(&mut self, group: &str) {
        let Some(cluster) = &mut self.cluster else { return };
        let Some((manifest, _)) = cluster.remote.remove(group) else {
            return;
        };
        tracing::info!(%group, "another group left (it said goodbye); its routes are forgotten");
        cluster.forget(&manifest);
        self.cluster_changed();
    }

    /// The link's state and how many other groups are heard from.
    #[cfg(test)]
    pub(crate) fn remote_link(&self) -> Option<ClusterLink> {
        self.cluster.as_ref().map(|c| c.link)
    }

    /// The port to the link, to say goodbye through when the router stops.
    pub(crate) fn remote_port(&self) -> Option<mpsc::Sender<ToRemote>> {
        self.cluster.as_ref().map(|c| c.port.clone())
    }

    /// The link's state, from the bridge.
    pub(crate) fn set_cluster_link(&mut self, state: LinkState) {
        let Some(cluster) = &mut self.cluster else { return };
        if state == LinkState::Connected && cluster.link.state != LinkState::Connected {
            // Nothing could be heard while the link was down: the others
            // get a full expiry period from now to be heard again.
            let now = tokio::time::Instant::now();
            for (_, seen) in cluster.remote.values_mut() {
                *seen = now;
            }
        }
        cluster.link.state = state;
        self.cluster_changed();
    }

    /// Forgets the groups not heard from for `MANIFEST_EXPIRY` while the
    /// link was up: they left (a group that is merely restarting sends a
    /// new manifest as soon as it is back).
    pub(crate) fn expire_remote(&mut self, now: tokio::time::Instant) {
        let Some(cluster) = &mut self.cluster else { return };
        if cluster.link.state != LinkState::Connected {
            return;
        }
        let gone: Vec<String> = cluster
            .remote
            .iter()
            .filter(|(_, (_, seen))| now.duration_since(*seen) >= MANIFEST_EXPIRY)
            .map(|(group, _)| group.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        for group in gone {
            tracing::info!(%group, "another group left (no manifest for too long); its routes are forgotten");
            if let Some((manifest, _)) = cluster.remote.remove(&group) {
                cluster.forget(&manifest);
            }
        }
        self.cluster_changed();
    }

    fn cluster_changed(&mut self) {
        if let Some(cluster) = &mut self.cluster {
            cluster.link.peers = cluster.remote.len() as u32;
            switchyard_proto::supervision::GAUGES.set_cluster(cluster.link);
        }
        self.publish();
    }

    /// Why a request no instance can take is refused: 503 while a manager
    /// that serves (or may serve) its type is down, 404 when no manager
    /// declares it. The type is named by its name when the request carries
    /// it (meta `event`: WebSocket and gRPC calls) or the router knows it.
    fn unroutable(&self, env: &Envelope) -> (u16, String) {
        if let Some(known) = self.known.get(&env.event_type) {
            return (503, format!("manager `{}` is not running", known.manager));
        }
        let name = env
            .meta
            .get(META_EVENT)
            .filter(|name| EventType::of(name) == env.event_type);
        let Some(name) = name else {
            // A listener's HTTP route comes from its route table, which
            // keeps the routes of every manager ever registered: this router
            // restarted since, and the manager has not registered again yet.
            if matches!(env.origin, Origin::Pipe(_)) {
                return (503, "no manager serves this route right now".to_owned());
            }
            return self.undeclared(&format!("{:#x}", env.event_type.0));
        };
        self.undeclared(&format!("`{name}`"))
    }

    /// A type no registered manager declares: 404, unless a declared
    /// manager has not registered yet (it may be the one that serves it).
    fn undeclared(&self, ty: &str) -> (u16, String) {
        match self.declared.iter().find(|m| !self.registered.contains(*m)) {
            Some(missing) => (
                503,
                format!(
                    "no running manager declares event type {ty}; manager `{missing}` has not started yet"
                ),
            ),
            None => (404, format!("no manager declares event type {ty}")),
        }
    }

    /// Least outstanding requests; ties broken round-robin.
    fn pick(&mut self, ty: EventType) -> Option<u64> {
        let list = self.handlers.get(&ty).filter(|l| !l.is_empty())?;
        let start = self.cursor.entry(ty).or_default();
        *start = (*start + 1) % list.len();
        let mut best: Option<(u32, u64)> = None;
        for k in 0..list.len() {
            let id = list[(*start + k) % list.len()];
            let outstanding = self.instances.get(&id).map_or(u32::MAX, |i| i.outstanding);
            if best.is_none_or(|(o, _)| outstanding < o) {
                best = Some((outstanding, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// A response from instance `from` (or the bridge): close its in-flight
    /// entry and pass it on. A response with no entry was already answered
    /// (503/504) and is dropped; one from an instance the request was not
    /// sent to is refused, and the request stays in flight for the
    /// instance that has it.
    pub(crate) fn complete(&mut self, env: Envelope, from: u64) {
        let key = (env.origin, env.correlation);
        let Some(flight) = self.in_flight.get(&key) else {
            return tracing::debug!(
                origin = ?env.origin,
                request_id = env.context.request_id_field(), trace_id = env.context.trace_id_field(),
                "late response dropped"
            );
        };
        if flight.instance != from {
            let (manager, first) = match self.instances.get_mut(&from) {
                Some(inst) => {
                    inst.refused_responses += 1;
                    (inst.name.clone(), inst.refused_responses == 1)
                }
                None if from == LISTENERS_ID => (String::from("listeners"), true),
                None => (String::from("cluster"), true),
            };
            if first {
                tracing::warn!(
                    manager = %manager,
                    instance = from,
                    origin = ?env.origin,
                    "response refused: this instance was not sent the request (later ones from it are logged at debug)"
                );
            } else {
                tracing::debug!(manager = %manager, instance = from, origin = ?env.origin, "response refused: not sent the request");
            }
            return;
        }
        let Some(flight) = self.in_flight.remove(&key) else {
            return;
        };
        if let Some(inst) = self.instances.get_mut(&flight.instance) {
            inst.outstanding = inst.outstanding.saturating_sub(1);
        }
        self.deliver(env);
    }

    /// Instance `from` answered these requests of listener pipes straight
    /// into its return links to their listeners (decision 0143): close their in-flight
    /// entries as [`complete`](Self::complete) would, with nothing to pass
    /// on. A request it was not sent stays in flight for the instance
    /// that has it; one no longer in flight was answered 503/504 already.
    pub(crate) fn completed(&mut self, from: u64, requests: &[(u64, u64)]) {
        let mut done = 0u32;
        for &(pipe, correlation) in requests {
            let key = (Origin::Pipe(pipe), correlation);
            if self.in_flight.get(&key).is_some_and(|f| f.instance == from) {
                self.in_flight.remove(&key);
                done += 1;
            } else {
                tracing::debug!(
                    instance = from,
                    pipe,
                    correlation,
                    "completion of a request not in flight there"
                );
            }
        }
        if let Some(inst) = self.instances.get_mut(&from) {
            inst.outstanding = inst.outstanding.saturating_sub(done);
        }
    }

    /// An instance's offer of a return link to a listener process: to the
    /// broker, which passes it to the pipe its origin names. Dropped without a broker
    /// (the instance's answers then come this way).
    pub(crate) fn forward_offer(&self, env: Envelope) {
        if !matches!(env.origin, Origin::Pipe(_)) {
            return tracing::debug!(origin = ?env.origin, "return-link offer not for a pipe dropped");
        }
        if let Some(broker) = &self.broker
            && let Err(refused) = broker.send(env)
        {
            tracing::debug!(%refused, "return-link offer not forwarded to the broker");
        }
    }

    /// Every subscriber gets the notification, except the instance it came
    /// from; the broker gets it too, for the WebSocket clients subscribed.
    pub(crate) fn route_notification(&mut self, env: Envelope, from: Option<u64>) {
        // Subscriptions by prefix match the name: it must be the type's.
        if let Some(name) = env.meta.get(META_EVENT)
            && EventType::of(name) != env.event_type
        {
            return tracing::warn!(
                event = name,
                ?from,
                "notification dropped: its name does not match its type id"
            );
        }
        // To the other groups, unless it came from them: nothing loops.
        if let Some(cluster) = &self.cluster
            && from != Some(BRIDGE_ID)
            && cluster
                .port
                .try_send(ToRemote::Notification(env.clone()))
                .is_err()
        {
            tracing::warn!("cluster bridge not keeping up; notification not sent to other groups");
        }
        if let Some(broker) = &self.broker
            && let Err(refused) = broker.send(env.clone())
        {
            tracing::warn!(%refused, "notification not forwarded to the broker");
        }
        if let Some(list) = self.subscribers.get(&env.event_type) {
            for id in list.iter().filter(|&&id| Some(id) != from) {
                if let Some(inst) = self.instances.get(id)
                    && let Err(refused) = inst.sink.send(env.clone())
                {
                    tracing::warn!(%refused, manager = %inst.name, "notification dropped");
                }
            }
        }
    }

    /// Requests routed and not answered yet, and frames waiting in the
    /// queues towards the managers.
    pub(crate) fn gauges(&self) -> (usize, usize) {
        let queued = self.instances.values().map(|i| i.sink.queued()).sum();
        (self.in_flight.len(), queued)
    }

    /// The caller of request `correlation` of `origin` no longer wants it:
    /// forget it (its instance counts one request fewer for balancing) and
    /// tell the instance, which stops working on it. Nothing is answered:
    /// nobody waits. A request already answered or unknown is ignored.
    pub(crate) fn cancel(&mut self, origin: Origin, correlation: u64) {
        let Some(flight) = self.in_flight.remove(&(origin, correlation)) else {
            return tracing::debug!(?origin, correlation, "cancel of a request no longer in flight");
        };
        tracing::debug!(
            ?origin,
            correlation,
            instance = flight.instance,
            "request cancelled by its caller"
        );
        self.cancel_at(flight.instance, origin, correlation);
    }

    /// Tells `instance` that request `correlation` of `origin`, which it
    /// was serving, is no longer wanted; one fewer outstanding on it.
    fn cancel_at(&mut self, instance: u64, origin: Origin, correlation: u64) {
        // Another group's request: its own deadline ends it there; a
        // listener's job call ends at the same deadline.
        if instance == BRIDGE_ID || instance == LISTENERS_ID {
            return;
        }
        let Some(inst) = self.instances.get_mut(&instance) else {
            return;
        };
        inst.outstanding = inst.outstanding.saturating_sub(1);
        match Control::cancel(origin, correlation) {
            Ok(env) => {
                if let Err(refused) = inst.sink.send(env) {
                    tracing::debug!(%refused, manager = %inst.name, "cancel not sent to the manager");
                }
            }
            Err(err) => tracing::error!(%err, "cannot encode a cancel"),
        }
    }

    /// Answers every request past its deadline with 504, and cancels it
    /// at its instance: the handler's work stops at the deadline too.
    pub(crate) fn expire(&mut self, now: u64) {
        if self.in_flight.is_empty() {
            return;
        }
        let expired: Vec<(Origin, u64)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline.expired_at(now))
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            if let Some(flight) = self.in_flight.remove(&key) {
                self.cancel_at(flight.instance, key.0, key.1);
                self.deliver(
                    Refusal::timed_out(Hop::Router, "deadline exceeded").answer(&stub_request(key.0, key.1)),
                );
            }
        }
    }

    /// Sends a response to its origin.
    fn deliver(&self, env: Envelope) {
        if env.origin == Origin::Manager(BRIDGE_ID) {
            if let Some(cluster) = &self.cluster
                && cluster.port.try_send(ToRemote::Response(env)).is_err()
            {
                tracing::warn!("cluster bridge not keeping up; response to another group dropped");
            }
            return;
        }
        let sink = match env.origin {
            Origin::Pipe(_) => self.broker.as_ref(),
            Origin::Manager(id) => self.instances.get(&id).map(|i| &i.sink),
            Origin::Unset => None,
        };
        match sink {
            Some(sink) => {
                if let Err(refused) = sink.send(env) {
                    let request_id = refused.envelope.context.request_id_field();
                    let trace_id = refused.envelope.context.trace_id_field();
                    tracing::warn!(%refused, request_id, trace_id, "response dropped");
                }
            }
            None => tracing::debug!(
                origin = ?env.origin,
                request_id = env.context.request_id_field(), trace_id = env.context.trace_id_field(),
                "response to a gone origin dropped"
            ),
        }
    }

    /// Sends the current route table to the broker.
    fn publish(&mut self) {
        self.version += 1;
        self.tell_cluster();
        let Some(broker) = &self.broker else { return };
        let mut managers: BTreeMap<String, u32> = self.declared.iter().map(|n| (n.clone(), 0)).collect();
        for inst in self.instances.values().filter(|i| !i.draining) {
            *managers.entry(inst.name.clone()).or_default() += 1;
        }
        let mut routes = self.routes.clone();
        let mut needs = self.needs.clone();
        let mut retired: Vec<String> = self.retired.iter().cloned().collect();
        // Other groups' routes are served here too, once every local
        // manager has declared its own (until then a local route may be
        // missing, and listeners never forget a route they were given):
        // never one that would take requests from a local route.
        if let Some(cluster) = &self.cluster
            && self.declared.iter().all(|m| self.registered.contains(m))
        {
            let local_types: HashSet<EventType> = self.known.keys().copied().collect();
            let remote = remote_routes(
                self.routes.values(),
                &local_types,
                cluster.remote.values().map(|(m, _)| m),
            );
            for entry in remote {
                routes
                    .entry((entry.route.method.clone(), entry.route.path.clone()))
                    .or_insert(entry);
            }
            for (m, _) in cluster.remote.values() {
                for n in &m.needs {
                    needs.entry(n.event_type).or_insert_with(|| n.needs.clone());
                }
            }
        }
        if let Some(cluster) = &self.cluster {
            retired.extend(cluster.departed.iter().cloned());
        }
        let table = RouteTable {
            version: self.version,
            retired,
            cluster: self.cluster.as_ref().map(|c| c.link),
            routes: routes.into_values().collect(),
            managers: managers
                .into_iter()
                .map(|(name, instances_up)| ManagerHealth { name, instances_up })
                .collect(),
            needs: needs
                .iter()
                .map(|(event_type, needs)| TypeNeeds {
                    event_type: *event_type,
                    needs: needs.clone(),
                })
                .collect(),
            types: self
                .known
                .iter()
                .map(|(event_type, known)| DeclaredType {
                    name: known.type_name.clone(),
                    event_type: *event_type,
                    public: known.public,
                })
                .collect(),
            notifications: self.notifications.values().cloned().collect(),
        };
        match Envelope::control(&Control::RouteTable(table)) {
            Ok(env) => {
                if let Err(refused) = broker.send(env) {
                    tracing::warn!(%refused, "route table not sent");
                }
            }
            Err(err) => tracing::error!(%err, "cannot encode route table"),
        }
    }
}

impl Table {
    /// Tells the bridge what this group serves now, when that changed: it
    /// subscribes to those types and tells the other groups.
    fn tell_cluster(&mut self) {
        let Some(cluster) = &self.cluster else { return };
        let serves: std::collections::BTreeSet<EventType> = self
            .handlers
            .iter()
            .filter(|(_, list)| !list.is_empty())
            .map(|(ty, _)| *ty)
            .collect();
        let manifest = Manifest {
            routes: self
                .routes
                .values()
                .filter(|e| serves.contains(&e.event_type))
                .cloned()
                .collect(),
            needs: self
                .needs
                .iter()
                .filter(|(ty, _)| serves.contains(ty))
                .map(|(event_type, needs)| TypeNeeds {
                    event_type: *event_type,
                    needs: needs.clone(),
                })
                .collect(),
            serves,
        };
        if cluster.told.as_ref() == Some(&manifest) {
            return;
        }
        if cluster.port.try_send(ToRemote::Local(manifest.clone())).is_ok()
            && let Some(cluster) = &mut self.cluster
        {
            cluster.told = Some(manifest);
        }
    }
}

/// The minimal request an error response is built from.
fn stub_request(origin: Origin, correlation: u64) -> Envelope {
    let mut env = Envelope::request(EventType::CONTROL, correlation, Default::default());
    env.origin = origin;
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::control::HttpRoute;

    fn entry(manager: &str, ty: &str, method: &str, path: &str) -> RouteEntry {
        RouteEntry {
            route: HttpRoute {
                method: method.into(),
                path: path.into(),
                stream_body: false,
            },
            event_type: EventType::of(ty),
            type_name: ty.into(),
            manager: manager.into(),
        }
    }

    fn manifest(routes: Vec<RouteEntry>) -> Manifest {
        Manifest {
            serves: routes.iter().map(|e| e.event_type).collect(),
            routes,
            needs: Vec::new(),
        }
    }

    #[test]
    fn local_routes_win_over_remote_ones() {
        let local = [
            entry("basics", "demo.Hello", "GET", "/hello/{name}"),
            entry("basics", "demo.Noop", "GET", "/noop"),
        ];
        let local_types: HashSet<EventType> = local.iter().map(|e| e.event_type).collect();
        let remote = [
            manifest(vec![
                // Same shape, another parameter name: would conflict.
                entry("evil@g1", "evil.Hello", "GET", "/hello/{any}"),
                // A static path under a local parameter: would take it.
                entry("evil@g1", "evil.Admin", "GET", "/hello/admin"),
                // The same route.
                entry("evil@g1", "evil.Noop", "GET", "/noop"),
                // Another path to a local type.
                entry("evil@g1", "demo.Noop", "GET", "/also-noop"),
                // Its own.
                entry("pay@g1", "demo.Payload", "GET", "/payload/{size}"),
                // Another method of a local path is not a local route.
                entry("pay@g1", "demo.PostNoop", "POST", "/noop"),
            ]),
            manifest(vec![
                // Taken by the first group already.
                entry("pay@g2", "demo.Payload2", "GET", "/payload/{n}"),
                entry("x@g2", "x.Y", "GET", "/x"),
            ]),
        ];
        let got: Vec<String> = remote_routes(local.iter(), &local_types, remote.iter())
            .into_iter()
            .map(|e| format!("{} {} {}", e.manager, e.route.method, e.route.path))
            .collect();
        assert_eq!(
            got,
            ["pay@g1 GET /payload/{size}", "pay@g1 POST /noop", "x@g2 GET /x"]
        );
    }

    #[test]
    fn a_name_must_be_the_registered_name_of_its_id() {
        let mut table = Table::new(vec![], 8);
        // As if `t.Real` and `t.Twin` collided: the id is registered under
        // the other name.
        table.known.insert(
            EventType::of("t.Twin"),
            Known {
                type_name: "t.Real".into(),
                manager: "m".into(),
                public: true,
            },
        );
        let named = |name: &str, id: &str| {
            let mut env = Envelope::request(EventType::of(id), 1, Default::default());
            env.meta.push(META_EVENT, name);
            env
        };
        assert_eq!(table.misnamed(&named("t.Twin", "t.Twin")).map(|m| m.0), Some(404));
        assert_eq!(
            table.misnamed(&named("t.Twin", "t.Other")).map(|m| m.0),
            Some(400)
        );
        assert_eq!(table.misnamed(&named("t.Free", "t.Free")), None);
        let unnamed = Envelope::request(EventType::of("t.Twin"), 1, Default::default());
        assert_eq!(table.misnamed(&unnamed), None);
    }

    #[test]
    fn a_manifest_is_bounded_and_its_managers_named_by_group() {
        let routes: Vec<RouteEntry> = (0..MAX_REMOTE_ROUTES + 10)
            .map(|i| entry("m", &format!("t.T{i}"), "GET", &format!("/r/{i}")))
            .collect();
        let (kept, cut) = bounded("g7", manifest(routes));
        assert!(cut);
        assert_eq!(kept.routes.len(), MAX_REMOTE_ROUTES);
        assert_eq!(kept.serves.len(), MAX_REMOTE_ROUTES + 10);
        assert!(kept.routes.iter().all(|e| e.manager == "m@g7"));
        let (small, cut) = bounded("g8", manifest(vec![entry("m", "a.B", "GET", "/b")]));
        assert!(!cut);
        assert_eq!(small.routes[0].manager, "m@g8");
    }

    #[test]
    fn a_departed_group_is_remembered_for_listeners_boundedly() {
        let mut departed = std::collections::VecDeque::new();
        for g in 0..MAX_DEPARTED + 5 {
            let (m, _) = bounded(&format!("g{g}"), manifest(vec![entry("m", "a.B", "GET", "/b")]));
            for e in &m.routes {
                departed.push_back(e.manager.clone());
            }
            while departed.len() > MAX_DEPARTED {
                departed.pop_front();
            }
        }
        assert_eq!(departed.len(), MAX_DEPARTED);
        assert_eq!(departed.back().unwrap(), &format!("m@g{}", MAX_DEPARTED + 4));
    }

    /// Routing, balancing, a dead instance and deadlines, on a table with
    /// real frame links (socket pairs) and the clock handed in: `expire`
    /// takes the time, so no test here waits for one.
    mod routing {
        use bytes::Bytes;
        use switchyard_proto::transport::{FrameReader, spawn_writer};
        use switchyard_proto::{DEFAULT_MAX_FRAME, Kind};
        use tokio::net::UnixStream;

        use super::*;

        /// Frames the table sends, as the peer reads them.
        struct Peer(FrameReader<UnixStream>);

        impl Peer {
            /// The next request or response, past route tables and cancels.
            async fn next_event(&mut self) -> Envelope {
                loop {
                    let env = self.next().await;
                    if env.kind != Kind::Control {
                        return env;
                    }
                }
            }

            async fn next(&mut self) -> Envelope {
                // Frames written before the call are already in the socket:
                // the wait is only for the writer task to flush them.
                tokio::time::timeout(std::time::Duration::from_secs(30), self.0.next())
                    .await
                    .expect("a frame")
                    .unwrap()
                    .expect("the link is open")
            }
        }

        fn link() -> (FrameSink, Peer) {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let (sink, _writer) = spawn_writer(ours, 64, DEFAULT_MAX_FRAME);
            (sink, Peer(FrameReader::new(theirs, DEFAULT_MAX_FRAME)))
        }

        fn manager(name: &str, ty: &str) -> ManagerDescription {
            ManagerDescription {
                name: name.into(),
                pid: 1,
                handles: vec![HandledType {
                    name: ty.into(),
                    event_type: EventType::of(ty),
                    route: None,
                    needs: Default::default(),
                    public: true,
                }],
                subscribes: vec![],
                notifications: vec![],
            }
        }

        /// A listener's request for `ty`, named as listeners name it.
        fn request(ty: &str, correlation: u64) -> Envelope {
            let mut env = Envelope::request(EventType::of(ty), correlation, Bytes::new());
            env.origin = Origin::Pipe(1);
            env.meta.push(META_EVENT, ty);
            env
        }

        /// The instance request `correlation` (of pipe 1) is in flight at.
        fn serving(table: &Table, correlation: u64) -> Option<u64> {
            table
                .in_flight
                .get(&(Origin::Pipe(1), correlation))
                .map(|f| f.instance)
        }

        fn table_with_broker(declared: &[&str], max_outstanding: u32) -> (Table, Peer) {
            let mut table = Table::new(declared.iter().map(|d| d.to_string()).collect(), max_outstanding);
            let (broker, answers) = link();
            table.set_broker(Some(broker));
            (table, answers)
        }

        #[tokio::test]
        async fn a_request_goes_to_its_types_manager_and_its_answer_back() {
            let (mut table, mut answers) = table_with_broker(&["a", "b"], 8);
            let (sink_a, mut at_a) = link();
            let (sink_b, mut at_b) = link();
            let a = table.add_instance(manager("a", "t.A"), sink_a).unwrap();
            table.add_instance(manager("b", "t.B"), sink_b).unwrap();

            table.route_request(request("t.B", 1));
            table.route_request(request("t.A", 2));
            assert_eq!(at_b.next_event().await.correlation, 1);
            let sent = at_a.next_event().await;
            assert_eq!(sent.correlation, 2);
            assert_eq!(serving(&table, 2), Some(a));

            table.complete(
                Envelope::response_to(&sent, 201, Default::default(), Bytes::new()),
                a,
            );
            let answer = answers.next_event().await;
            assert_eq!((answer.correlation, answer.status), (2, 201));
            assert_eq!(Hop::of(&answer.meta), None, "the handler's own answer");
            assert_eq!(serving(&table, 2), None);

            // No manager declares it: 404, made by the router.
            table.route_request(request("t.Nobody", 3));
            let refused = answers.next_event().await;
            assert_eq!((refused.correlation, refused.status), (3, 404));
            assert_eq!(Hop::of(&refused.meta), Some(Hop::Router));
        }

        #[tokio::test]
        async fn the_instance_with_fewest_outstanding_requests_gets_the_next() {
            let (mut table, _answers) = table_with_broker(&["m"], 8);
            let (sink_1, _at_1) = link();
            let (sink_2, _at_2) = link();
            let one = table.add_instance(manager("m", "t.M"), sink_1).unwrap();
            let two = table.add_instance(manager("m", "t.M"), sink_2).unwrap();

            // Ties alternate.
            table.route_request(request("t.M", 1));
            table.route_request(request("t.M", 2));
            let first = serving(&table, 1).unwrap();
            let second = serving(&table, 2).unwrap();
            assert_eq!(
                [first, second].iter().collect::<HashSet<_>>(),
                [one, two].iter().collect()
            );
            // One more each, then `first` finishes two: it has fewer, and
            // takes the next two whichever way the tie-break cursor points.
            table.route_request(request("t.M", 3));
            table.route_request(request("t.M", 4));
            let on_first: Vec<u64> = (1..=4).filter(|&c| serving(&table, c) == Some(first)).collect();
            assert_eq!(on_first.len(), 2);
            let mut done = Envelope::request(EventType::of("t.M"), 0, Bytes::new());
            done.kind = Kind::Response;
            done.origin = Origin::Pipe(1);
            for &c in &on_first {
                done.correlation = c;
                table.complete(done.clone(), first);
            }
            table.route_request(request("t.M", 5));
            table.route_request(request("t.M", 6));
            assert_eq!(serving(&table, 5), Some(first));
            assert_eq!(serving(&table, 6), Some(first));
        }

        #[tokio::test]
        async fn an_instance_at_capacity_refuses_with_503() {
            let (mut table, mut answers) = table_with_broker(&["m"], 1);
            let (sink, _at) = link();
            table.add_instance(manager("m", "t.M"), sink).unwrap();
            table.route_request(request("t.M", 1));
            table.route_request(request("t.M", 2));
            let refused = answers.next_event().await;
            assert_eq!((refused.correlation, refused.status), (2, 503));
            assert_eq!(Hop::of(&refused.meta), Some(Hop::Router));
        }

        #[tokio::test]
        async fn a_dead_instances_requests_are_answered_503_and_its_type_waits_for_it() {
            let (mut table, mut answers) = table_with_broker(&["m"], 8);
            let (sink, _at) = link();
            let id = table.add_instance(manager("m", "t.M"), sink).unwrap();
            table.route_request(request("t.M", 1));
            table.route_request(request("t.M", 2));

            assert_eq!(table.remove_instance(id), 2);
            let mut failed: Vec<(u64, u16)> = Vec::new();
            for _ in 0..2 {
                let answer = answers.next_event().await;
                assert_eq!(Hop::of(&answer.meta), Some(Hop::Router));
                failed.push((answer.correlation, answer.status));
            }
            failed.sort();
            assert_eq!(failed, [(1, 503), (2, 503)]);
            assert!(table.in_flight.is_empty());

            // Declared and down (restarting): 503 with a retry-after, not 404.
            table.route_request(request("t.M", 3));
            let refused = answers.next_event().await;
            assert_eq!((refused.correlation, refused.status), (3, 503));
            assert_eq!(refused.meta.get("retry-after"), Some("1"));
        }

        #[tokio::test]
        async fn a_request_past_its_deadline_is_answered_504_and_cancelled_at_its_instance() {
            let (mut table, mut answers) = table_with_broker(&["m"], 8);
            let (sink, mut at) = link();
            let id = table.add_instance(manager("m", "t.M"), sink).unwrap();
            let mut due = request("t.M", 1);
            due.deadline = Deadline(5_000_000);
            table.route_request(due);
            // No deadline: never expires.
            table.route_request(request("t.M", 2));
            assert_eq!(at.next_event().await.correlation, 1);
            assert_eq!(at.next_event().await.correlation, 2);

            table.expire(4_999_999);
            assert_eq!(serving(&table, 1), Some(id));
            table.expire(5_000_000);
            assert_eq!(serving(&table, 1), None);
            assert_eq!(serving(&table, 2), Some(id));
            assert_eq!(table.instances[&id].outstanding, 1);
            let late = answers.next_event().await;
            assert_eq!((late.correlation, late.status), (1, 504));
            assert_eq!(Hop::of(&late.meta), Some(Hop::Router));
            // The handler is told to stop.
            let cancel = loop {
                let env = at.next().await;
                if env.kind == Kind::Control && matches!(env.decode_control(), Ok(Control::Cancel)) {
                    break env;
                }
            };
            assert_eq!((cancel.origin, cancel.correlation), (Origin::Pipe(1), 1));

            // Its answer, coming after all, is dropped: the client has its
            // 504. The next thing the broker sees is request 2's answer.
            let mut answer = Envelope::request(EventType::of("t.M"), 1, Bytes::new());
            answer.kind = Kind::Response;
            answer.origin = Origin::Pipe(1);
            answer.status = 200;
            table.complete(answer.clone(), id);
            answer.correlation = 2;
            table.complete(answer, id);
            let next = answers.next_event().await;
            assert_eq!((next.correlation, next.status), (2, 200));
        }

        /// Another group that stops sending its manifest is forgotten
        /// [`MANIFEST_EXPIRY`] after the last one, on the clock handed in.
        #[tokio::test]
        async fn a_silent_group_is_forgotten_when_its_manifest_expires() {
            let (mut table, _answers) = table_with_broker(&["m"], 8);
            let (port, _link) = mpsc::channel(16);
            table.set_cluster(port, HashSet::new());
            table.set_cluster_link(LinkState::Connected);
            let heard = tokio::time::Instant::now();
            table.set_remote("g1".into(), manifest(vec![entry("pay", "p.Pay", "GET", "/pay")]));
            assert_eq!(table.remote_link().map(|l| l.peers), Some(1));

            table.expire_remote(heard + MANIFEST_EXPIRY - std::time::Duration::from_millis(1));
            assert_eq!(table.remote_link().map(|l| l.peers), Some(1));
            // Read after the manifest was kept: at least MANIFEST_EXPIRY later.
            table.expire_remote(tokio::time::Instant::now() + MANIFEST_EXPIRY);
            assert_eq!(table.remote_link().map(|l| l.peers), Some(0));
        }
    }
}
