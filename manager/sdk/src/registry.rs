//! The handlers a manager declares, keyed by event type.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_proto::codec;

use switchyard_proto::EventType;
use switchyard_proto::api::{TypeDoc, TypeRole};
use switchyard_proto::control::{DeclaredType, HandledType, HttpRoute, RequestNeeds};

use crate::context::Context;
use crate::event::{Event, Request};
use crate::reply::{Error, Reply, Response};

/// A manager: a type with state that answers events. Instances are created
/// once per process with the manager's config; handlers then run one at a
/// time on the manager's thread, so state needs no locks.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use switchyard_manager::{Config, Context, Error, Event, Manager, Registry, Reply};
///
/// #[derive(Serialize, Deserialize, Event)]
/// #[event(name = "demo.Hello", http = "GET /hello/{name}")]
/// struct Hello { #[validate(length(min = 1, max = 64))] name: String }
///
/// #[derive(Serialize, Reply)]
/// struct Greeting { message: String }
///
/// #[derive(Default)]
/// struct Greeter { greeted: u64 }
///
/// impl Manager for Greeter {
///     const NAME: &'static str = "greeter";
///     fn create(_: &Config) -> Result<Self, Error> { Ok(Greeter::default()) }
///     fn register(r: &mut Registry<Self>) { r.handle(Self::greet); }
/// }
///
/// impl Greeter {
///     fn greet(&mut self, ev: Hello, _cx: &mut Context) -> Result<Greeting, Error> {
///         self.greeted += 1;
///         Ok(Greeting { message: format!("Hello, {}!", ev.name) })
///     }
/// }
/// ```
pub trait Manager: Sized + 'static {
    /// The manager type's name; `switchyard.toml` selects it by this name.
    const NAME: &'static str;
    /// Creates the instance; runs once per process, before any event. An
    /// error is why the manager cannot start: `switchyard check` and `up`
    /// report it. Those run `create` once more in a short-lived validation
    /// process ([`Config::validation`]): keep lasting side effects (files,
    /// sockets) out of it, or skip them when validating.
    ///
    /// It runs inside the plugin's tokio runtime (decision 0120): a lazy
    /// pool or an HTTP client made here works in the handlers, and
    /// `tokio::runtime::Handle::current().block_on(..)` may await a first
    /// connection or migrations (`create` is not inside an executor).
    fn create(config: &Config) -> Result<Self, Error>;
    /// Declares the handlers; runs once, right after `create`.
    fn register(registry: &mut Registry<Self>);
}

/// What `Manager::create` is given.
pub struct Config {
    /// The configured manager name (instances share it).
    pub name: String,
    /// This instance's number (0-based).
    pub instance: u32,
    /// The `config` table of the manager in `switchyard.toml`.
    pub value: serde_json::Value,
    /// This instance is made only to check the configuration, and is
    /// dropped at once without serving anything.
    pub validation: bool,
}

impl Config {
    /// The config table as `T`.
    pub fn get<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_value(self.value.clone())
            .map_err(|e| Error::internal(format!("config of manager `{}` does not fit: {e}", self.name)))
    }

    /// The config table as `T`, or `T::default()` when the manager has no
    /// `config` table in `switchyard.toml`. A table that is there but does
    /// not fit `T` is still an error: a typo must not pass for a default.
    ///
    /// ```
    /// # use switchyard_manager::Config;
    /// #[derive(serde::Deserialize, Default, Debug, PartialEq)]
    /// #[serde(default)]
    /// struct Settings { greeting: String, limit: u32 }
    ///
    /// let none = Config { name: "m".into(), instance: 0, value: serde_json::Value::Null, validation: false };
    /// assert_eq!(none.get_or_default::<Settings>().unwrap(), Settings::default());
    /// let some = Config { value: serde_json::json!({ "limit": 3 }), ..none };
    /// assert_eq!(some.get_or_default::<Settings>().unwrap().limit, 3);
    /// ```
    pub fn get_or_default<T: serde::de::DeserializeOwned + Default>(&self) -> Result<T, Error> {
        if self.value.is_null() {
            return Ok(T::default());
        }
        self.get()
    }
}

/// Shared access to the manager's state from async handlers. Borrow it for
/// a moment with [`State::with`]; never across an `.await`.
pub struct State<M>(pub(crate) Rc<RefCell<M>>);

impl<M> Clone for State<M> {
    fn clone(&self) -> Self {
        State(self.0.clone())
    }
}

impl<M> State<M> {
    /// Runs `f` with the manager's state. Other requests' handlers cannot
    /// run meanwhile, and `f` cannot await: the borrow ends before the
    /// handler's next `.await`.
    pub fn with<T>(&self, f: impl FnOnce(&mut M) -> T) -> T {
        f(&mut self.0.borrow_mut())
    }
}

/// Something [`Registry::handle`] registers: a request handler, sync or
/// async, or an upload or multipart-form handler. `T` tells the shapes
/// apart (a [`marker`]) and is inferred; nothing implements this by hand.
///
/// | shape | runs |
/// |---|---|
/// | `fn(&mut self, E, &mut Context) -> Result<R, Error>` | at once, with the state to itself |
/// | `fn(State<Self>, E, Context) -> Result<R, Error>` | at once |
/// | `async fn(State<Self>, E, Context) -> Result<R, Error>` | as a task: it may await calls, jobs, timers; other requests are served meanwhile |
/// | `fn(E, &mut BodyReader) -> Result<R, Error>` | on a thread of its own, the body streamed ([`upload`](Registry::upload)) |
/// | `fn(E, &mut Multipart) -> Result<R, Error>` | on a thread of its own, the form streamed ([`multipart`](Registry::multipart)) |
///
/// The second and third take the same arguments: making a handler `async`
/// to await a call changes nothing else, neither its parameters nor its
/// registration (decision 0125).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler `Registry::handle` knows",
    label = "expected `fn(&mut M, E, &mut Context)`, `[async] fn(State<M>, E, Context)`, `fn(E, &mut BodyReader)` or `fn(E, &mut Multipart)` returning `Result<R, Error>`",
    note = "a closure needs its parameters' types written out"
)]
pub trait Handler<M, T>: 'static {
    /// The event the handler answers.
    type Event: Event;
    /// What it returns: the event's `#[event(reply = ..)]` if it names one.
    type Reply;
    #[doc(hidden)]
    fn add_to(self, registry: &mut Registry<M>);
}

/// The shapes of [`Handler`]s; inferred, never named.
pub mod marker {
    /// `fn(&mut M, E, &mut Context)`.
    pub struct Exclusive;
    /// `fn(State<M>, E, Context) -> Result<..>`.
    pub struct Ready;
    /// `async fn(State<M>, E, Context)`.
    pub struct Awaits;
    /// `fn(E, &mut BodyReader)`.
    pub struct Upload;
    /// `fn(E, &mut Multipart)`.
    pub struct Form;
}

impl<M: Manager, E: Event, R: Reply + 'static, F> Handler<M, (marker::Exclusive, E, R)> for F
where
    F: Fn(&mut M, E, &mut Context) -> Result<R, Error> + 'static,
{
    type Event = E;
    type Reply = R;
    fn add_to(self, registry: &mut Registry<M>) {
        registry.add_exclusive(self);
    }
}

impl<M: Manager, E: Event, R: Reply + 'static, F> Handler<M, (marker::Ready, E, R)> for F
where
    F: Fn(State<M>, E, Context) -> Result<R, Error> + 'static,
{
    type Event = E;
    type Reply = R;
    fn add_to(self, registry: &mut Registry<M>) {
        registry.add_async(move |state, event, cx| std::future::ready(self(state, event, cx)));
    }
}

impl<M: Manager, E: Event, R: Reply + 'static, F, Fut> Handler<M, (marker::Awaits, E, R, Fut)> for F
where
    F: Fn(State<M>, E, Context) -> Fut + 'static,
    Fut: Future<Output = Result<R, Error>> + 'static,
{
    type Event = E;
    type Reply = R;
    fn add_to(self, registry: &mut Registry<M>) {
        registry.add_async(self);
    }
}

impl<M: Manager, E: Event + Send, R: Reply + 'static, F> Handler<M, (marker::Upload, E, R)> for F
where
    F: Fn(E, &mut crate::stream::BodyReader) -> Result<R, Error> + Send + Sync + 'static,
{
    type Event = E;
    type Reply = R;
    fn add_to(self, registry: &mut Registry<M>) {
        registry.add_upload(self);
    }
}

impl<M: Manager, E: Event + Send, R: Reply + 'static, F> Handler<M, (marker::Form, E, R)> for F
where
    F: Fn(E, &mut crate::Multipart) -> Result<R, Error> + Send + Sync + 'static,
{
    type Event = E;
    type Reply = R;
    fn add_to(self, registry: &mut Registry<M>) {
        registry.add_multipart(crate::MultipartLimits::default(), self);
    }
}

pub(crate) type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

type SyncHandler<M> = Box<dyn Fn(&mut M, &Request<'_>, &mut Context) -> Result<Response, Error>>;
type ReplyFuture = LocalFuture<Result<Response, Error>>;
type AsyncHandler<M> = Box<dyn Fn(State<M>, &Request<'_>, Context) -> Result<ReplyFuture, Error>>;

pub(crate) enum RequestHandler<M> {
    Sync(SyncHandler<M>),
    Async(AsyncHandler<M>),
}

/// A registered job function: bincode input → bincode output. Plain data
/// in, plain data out, no manager state: it runs on any thread, in any
/// process that loaded the plugin.
pub(crate) type JobFn = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, Error> + Send + Sync>;

/// An upload handler, prepared: the event is decoded (on the manager's
/// thread); what is left runs on a stream thread with the body.
pub(crate) type UploadWork = Box<dyn FnOnce() -> Result<Response, Error> + Send>;
pub(crate) type UploadHandler =
    Box<dyn Fn(&Request<'_>, crate::stream::BodyReader, crate::reply::Format) -> Result<UploadWork, Error>>;

pub(crate) type NotificationHandler<M> = Box<dyn Fn(&mut M, &Request<'_>, &mut Context) -> Result<(), Error>>;

/// The handlers of a manager.
pub struct Registry<M> {
    pub(crate) requests: HashMap<EventType, RequestHandler<M>>,
    pub(crate) uploads: HashMap<EventType, UploadHandler>,
    /// The template of each request type that names one.
    pub(crate) templates: HashMap<EventType, &'static str>,
    /// Routes `url_for` knows besides the handled types': event name →
    /// path (`link`).
    pub(crate) links: HashMap<String, String>,
    pub(crate) notifications: HashMap<EventType, NotificationHandler<M>>,
    pub(crate) handles: Vec<HandledType>,
    pub(crate) subscribes: Vec<EventType>,
    /// The notification types subscribed to or emitted, by name, with
    /// whether clients may send them (decision 0108).
    pub(crate) notification_types: Vec<DeclaredType>,
    pub(crate) jobs: HashMap<EventType, JobFn>,
    pub(crate) timers: Vec<Timer<M>>,
    /// Around every request handler, outermost first.
    pub(crate) middleware: Vec<Box<dyn crate::middleware::Erased>>,
    /// What the middleware read of every request.
    pub(crate) middleware_needs: RequestNeeds,
    /// How to describe each declared type; run only for a validation
    /// instance (decision 0060).
    pub(crate) docs: Vec<DocEntry>,
}

/// A declared type and how to describe it.
pub(crate) struct DocEntry {
    name: &'static str,
    role: TypeRole,
    make: fn(TypeRole) -> TypeDoc,
}

fn describe<E: Event, R: Reply>(role: TypeRole) -> TypeDoc {
    let mut generator = crate::schema::generator();
    let event = E::schema(&mut generator);
    let schema = crate::schema::standalone(event.schema, &mut generator);
    let reply = (role != TypeRole::Notification)
        .then(|| R::describe(&mut crate::schema::generator()))
        .flatten();
    TypeDoc {
        name: E::NAME.to_owned(),
        role,
        description: event.description,
        schema: schema.as_value().to_string(),
        whole_body: event.whole_body,
        params: event.params,
        reply,
    }
}

/// How often the host steps a manager's timers until the plugin has said
/// when the next one is due ([`Registry::every`]).
pub use switchyard_manager_abi::TICK_PERIOD;

pub(crate) type TimerFn<M> = fn(&mut M, &mut Context) -> Result<(), Error>;

pub(crate) struct Timer<M> {
    pub(crate) interval: fn(&M) -> std::time::Duration,
    pub(crate) handler: TimerFn<M>,
}

fn decode<E: Event>(request: &Request<'_>) -> Result<E, Error> {
    let event = E::from_request(request)?;
    event.validate()?;
    Ok(event)
}

impl<M: Manager> Registry<M> {
    pub(crate) fn new() -> Self {
        Registry {
            requests: HashMap::new(),
            uploads: HashMap::new(),
            templates: HashMap::new(),
            links: HashMap::new(),
            notifications: HashMap::new(),
            handles: Vec::new(),
            subscribes: Vec::new(),
            notification_types: Vec::new(),
            jobs: HashMap::new(),
            timers: Vec::new(),
            middleware: Vec::new(),
            middleware_needs: RequestNeeds::default(),
            docs: Vec::new(),
        }
    }

    /// Every declared type described (schemas made now).
    pub(crate) fn described(&self) -> Vec<TypeDoc> {
        self.docs.iter().map(|d| (d.make)(d.role)).collect()
    }

    fn document<E: Event, R: Reply>(&mut self, role: TypeRole) {
        self.docs.retain(|d| {
            !(d.name == E::NAME && (d.role == TypeRole::Notification) == (role == TypeRole::Notification))
        });
        self.docs.push(DocEntry {
            name: E::NAME,
            role,
            make: describe::<E, R>,
        });
    }

    /// Declares that this manager emits notifications of type `E`
    /// (`cx.notify`), so that the API description lists them with their
    /// fields (`/docs`, the typed gRPC subscriptions). Emitting needs no
    /// declaration; describing does.
    pub fn emits<E: Event>(&mut self) -> &mut Self {
        self.document::<E, ()>(TypeRole::Notification);
        self.declare_notification::<E>();
        self
    }

    fn declare_notification<E: Event>(&mut self) {
        let event_type = EventType::of(E::NAME);
        self.notification_types.retain(|t| t.event_type != event_type);
        self.notification_types.push(DeclaredType {
            name: E::NAME.to_owned(),
            event_type,
            public: E::PUBLIC,
        });
    }

    /// What the manager declares it serves: each request type with its
    /// route and what it reads of its request (its own declaration and
    /// the middleware's, which wrap every request handler).
    pub(crate) fn handled(&self) -> Vec<HandledType> {
        let mut handles = self.handles.clone();
        for h in &mut handles {
            if self.requests.contains_key(&h.event_type) {
                h.needs.merge(&self.middleware_needs);
            }
        }
        handles
    }

    /// Wraps every request handler of this manager (those
    /// [`handle`](Self::handle) registers, not uploads or forms) in `middleware`, inside the ones
    /// registered before it. See [`Middleware`](crate::Middleware).
    ///
    /// ```
    /// # use switchyard_manager::{Config, Context, Error, Flow, Incoming, Manager, Middleware, Registry};
    /// struct RequireKey;
    /// impl Middleware for RequireKey {
    ///     const REQUEST: switchyard_manager::RequestInfo = switchyard_manager::RequestInfo {
    ///         headers: &["x-api-key"], ..switchyard_manager::RequestInfo::NONE
    ///     };
    ///     fn before(&mut self, req: &mut Incoming<'_>, _: &mut Context) -> Result<Flow, Error> {
    ///         match req.header("x-api-key") {
    ///             Some("let-me-in") => Ok(Flow::Continue),
    ///             _ => Err(Error::new(401, "an API key is needed")),
    ///         }
    ///     }
    /// }
    /// # struct M;
    /// # impl Manager for M {
    /// #     const NAME: &'static str = "m";
    /// #     fn create(_: &Config) -> Result<Self, Error> { Ok(M) }
    /// fn register(r: &mut Registry<Self>) { r.middleware(RequireKey); }
    /// # }
    /// ```
    pub fn middleware<W: crate::Middleware>(&mut self, middleware: W) -> &mut Self {
        self.middleware.push(Box::new(middleware));
        self.middleware_needs.merge(&W::REQUEST.needs());
        self
    }

    fn declare<E: Event>(&mut self) -> EventType {
        self.declare_with::<E>(false)
    }

    /// Lets templates link to `E`'s route with `url_for("E's name", ...)`
    /// though this manager does not handle `E` (another manager of the
    /// group does). The routes of handled types are known already.
    pub fn link<E: Event>(&mut self) -> &mut Self {
        if let Some((_, path)) = E::ROUTE {
            self.links.insert(E::NAME.to_owned(), path.to_owned());
        }
        self
    }

    /// Event name → route path, for `url_for`: handled types and links.
    pub(crate) fn routes(&self) -> HashMap<String, String> {
        let mut routes = self.links.clone();
        for h in &self.handles {
            if let Some(route) = &h.route {
                routes.insert(h.name.clone(), route.path.clone());
            }
        }
        routes
    }

    fn declare_with<E: Event>(&mut self, stream_body: bool) -> EventType {
        let event_type = EventType::of(E::NAME);
        match E::TEMPLATE {
            Some(template) => self.templates.insert(event_type, template),
            None => self.templates.remove(&event_type),
        };
        self.handles.retain(|h| h.event_type != event_type);
        self.handles.push(HandledType {
            name: E::NAME.to_owned(),
            event_type,
            route: E::ROUTE.map(|(method, path)| HttpRoute {
                method: method.to_owned(),
                path: path.to_owned(),
                stream_body,
            }),
            needs: E::REQUEST.needs(),
            public: E::PUBLIC || E::ROUTE.is_some(),
        });
        event_type
    }

    /// The handler of the event it takes, sync or async, or of an upload
    /// or a multipart form: every shape [`Handler`] lists. When the event
    /// names its reply (`#[event(reply = R)]`), the handler must return
    /// that `R`, or this does not compile.
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// # use switchyard_manager::{Config, Context, Error, Event, Manager, Registry, Reply, State};
    /// #[derive(Serialize, Deserialize, Event)]
    /// #[event(name = "shop.Reserve", reply = Reserved)]
    /// struct Reserve { sku: String }
    ///
    /// #[derive(Serialize, Deserialize, Event)]
    /// #[event(name = "shop.Order", http = "POST /orders", reply = Ordered)]
    /// struct Order {
    ///     sku: String,
    ///     /// Declared and read in one place: no string to keep in sync.
    ///     #[from(header = "user-agent")]
    ///     agent: Option<String>,
    /// }
    ///
    /// #[derive(Serialize, Deserialize, Reply)]
    /// struct Reserved { left: u32 }
    /// #[derive(Serialize, Deserialize, Reply)]
    /// struct Ordered { order: u64, left: u32 }
    ///
    /// #[derive(Default)]
    /// struct Shop { orders: u64, stock: u32 }
    ///
    /// impl Manager for Shop {
    ///     const NAME: &'static str = "shop";
    ///     fn create(_: &Config) -> Result<Self, Error> { Ok(Shop { orders: 0, stock: 10 }) }
    ///     fn register(r: &mut Registry<Self>) {
    ///         r.handle(Self::reserve).handle(Self::order);
    ///     }
    /// }
    ///
    /// impl Shop {
    ///     fn reserve(&mut self, _: Reserve, _: &mut Context) -> Result<Reserved, Error> {
    ///         self.stock = self.stock.checked_sub(1).ok_or_else(|| Error::new(409, "sold out"))?;
    ///         Ok(Reserved { left: self.stock })
    ///     }
    ///
    ///     async fn order(state: State<Self>, ev: Order, cx: Context) -> Result<Ordered, Error> {
    ///         tracing::info!(agent = ?ev.agent, "ordering {}", ev.sku);
    ///         let reserved = cx.call(&Reserve { sku: ev.sku }).await?; // a `Reserved`
    ///         let order = state.with(|shop| { shop.orders += 1; shop.orders });
    ///         Ok(Ordered { order, left: reserved.left })
    ///     }
    /// }
    /// ```
    pub fn handle<T, H>(&mut self, handler: H) -> &mut Self
    where
        H: Handler<M, T>,
        H::Event: crate::event::Returns<H::Reply>,
    {
        handler.add_to(self);
        self
    }

    /// A synchronous request handler for `E`: it has the manager's state
    /// to itself for the duration of the call.
    #[deprecated(note = "use `handle`, which takes sync and async handlers alike (decision 0125)")]
    pub fn request<E: Event, R: Reply + 'static>(
        &mut self,
        handler: fn(&mut M, E, &mut Context) -> Result<R, Error>,
    ) -> &mut Self {
        self.add_exclusive(handler);
        self
    }

    /// An asynchronous request handler for `E`: it may await calls to other
    /// managers; other requests are served meanwhile.
    #[deprecated(note = "use `handle`, which takes sync and async handlers alike (decision 0125)")]
    pub fn request_async<E, R, F, Fut>(&mut self, handler: F) -> &mut Self
    where
        E: Event,
        R: Reply + 'static,
        F: Fn(State<M>, E, Context) -> Fut + 'static,
        Fut: Future<Output = Result<R, Error>> + 'static,
    {
        self.add_async(handler);
        self
    }

    fn add_exclusive<E: Event, R: Reply + 'static>(
        &mut self,
        handler: impl Fn(&mut M, E, &mut Context) -> Result<R, Error> + 'static,
    ) {
        let event_type = self.declare::<E>();
        self.document::<E, R>(TypeRole::Request);
        self.uploads.remove(&event_type);
        self.requests.insert(
            event_type,
            RequestHandler::Sync(Box::new(move |manager, request, cx| {
                let event = decode::<E>(request)?;
                let scope = crate::trace::scope_of(cx);
                crate::trace::scoped(scope, || handler(manager, event, cx))?.into_response(cx.format)
            })),
        );
    }

    fn add_async<E, R, F, Fut>(&mut self, handler: F)
    where
        E: Event,
        R: Reply + 'static,
        F: Fn(State<M>, E, Context) -> Fut + 'static,
        Fut: Future<Output = Result<R, Error>> + 'static,
    {
        let event_type = self.declare::<E>();
        self.document::<E, R>(TypeRole::Request);
        self.uploads.remove(&event_type);
        self.requests.insert(
            event_type,
            RequestHandler::Async(Box::new(move |state, request, cx| {
                let event = decode::<E>(request)?;
                let format = cx.format;
                let scope = crate::trace::scope_of(&cx);
                let fut = crate::trace::scoped(scope.clone(), || handler(state, event, cx));
                Ok(Box::pin(crate::trace::in_scope(scope, async move {
                    fut.await?.into_response(format)
                })))
            })),
        );
    }

    /// An upload handler for `E`: the request body is not buffered but read
    /// as it arrives, through `body`, on a thread of its own (at most
    /// [`MAX_STREAMS`](crate::MAX_STREAMS) at once), so uploads of any size
    /// take flat memory and never hold up the manager's other requests. It
    /// gets the event's path and query fields, but no manager state. Over
    /// HTTP the listener streams the body through a shared-memory pipe; from
    /// WebSocket, gRPC or a manager call the whole body arrives at once,
    /// behind the same [`BodyReader`](crate::BodyReader).
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// # use switchyard_manager::{BodyReader, Config, Error, Event, Manager, Registry, Reply};
    /// #[derive(Serialize, Deserialize, Event)]
    /// #[event(name = "files.Put", http = "PUT /files/{name}")]
    /// struct Put { name: String }
    ///
    /// #[derive(Serialize, Reply)]
    /// struct Stored { name: String, bytes: u64 }
    ///
    /// fn put(ev: Put, body: &mut BodyReader) -> Result<Stored, Error> {
    ///     let bytes = std::io::copy(body, &mut std::io::sink())?;
    ///     Ok(Stored { name: ev.name, bytes })
    /// }
    /// # struct Files;
    /// # impl Manager for Files {
    /// #     const NAME: &'static str = "files";
    /// #     fn create(_: &Config) -> Result<Self, Error> { Ok(Files) }
    /// fn register(r: &mut Registry<Self>) { r.handle(put); }
    /// # }
    /// ```
    #[deprecated(note = "use `handle`, which takes upload handlers too (decision 0125)")]
    pub fn upload<E: Event + Send, R: Reply + 'static>(
        &mut self,
        handler: fn(E, &mut crate::stream::BodyReader) -> Result<R, Error>,
    ) -> &mut Self {
        self.add_upload(handler);
        self
    }

    fn add_upload<E: Event + Send, R: Reply + 'static>(
        &mut self,
        handler: impl Fn(E, &mut crate::stream::BodyReader) -> Result<R, Error> + Send + Sync + 'static,
    ) {
        let event_type = self.declare_with::<E>(true);
        self.document::<E, R>(TypeRole::Upload);
        self.requests.remove(&event_type);
        let handler = Arc::new(handler);
        self.uploads.insert(
            event_type,
            Box::new(move |request, mut body, format| {
                let event = decode::<E>(request)?;
                let handler = handler.clone();
                Ok(Box::new(move || handler(event, &mut body)?.into_response(format)))
            }),
        );
    }

    /// A handler for `multipart/form-data` bodies of `E` (HTML forms with
    /// files; docs/web.md). The body streams in like an
    /// [`upload`](Self::upload)'s, on a thread of its own; the form's text
    /// fields up to its first file fill `E`'s fields (with the path and the
    /// query, as a JSON body's would), and the handler reads the rest, file
    /// by file, from the [`Multipart`](crate::Multipart). Browsers send a
    /// form's fields in document order: put file inputs last. Limits are
    /// [`MultipartLimits::default`](crate::MultipartLimits); a body that is
    /// not multipart is 415.
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// # use switchyard_manager::{Config, Error, Event, Manager, Multipart, Registry, Reply};
    /// #[derive(Serialize, Deserialize, Event)]
    /// #[event(name = "files.Post", http = "POST /files")]
    /// struct Post { title: Option<String> }
    ///
    /// #[derive(Serialize, Reply)]
    /// struct Stored { files: usize }
    ///
    /// fn post(ev: Post, form: &mut Multipart) -> Result<Stored, Error> {
    ///     let mut files = 0;
    ///     while let Some(mut part) = form.next_part()? {
    ///         std::io::copy(&mut part, &mut std::io::sink())?;
    ///         files += 1;
    ///     }
    ///     Ok(Stored { files })
    /// }
    /// # struct Files;
    /// # impl Manager for Files {
    /// #     const NAME: &'static str = "files";
    /// #     fn create(_: &Config) -> Result<Self, Error> { Ok(Files) }
    /// fn register(r: &mut Registry<Self>) { r.handle(post); }
    /// # }
    /// ```
    #[deprecated(note = "use `handle`, which takes multipart handlers too (decision 0125)")]
    pub fn multipart<E: Event + Send, R: Reply + 'static>(
        &mut self,
        handler: fn(E, &mut crate::Multipart) -> Result<R, Error>,
    ) -> &mut Self {
        self.add_multipart(crate::MultipartLimits::default(), handler);
        self
    }

    /// A multipart handler (what [`handle`](Self::handle) makes of a
    /// `fn(E, &mut Multipart)`) with other limits than the default.
    pub fn multipart_with<E: crate::event::Returns<R> + Send, R: Reply + 'static>(
        &mut self,
        limits: crate::MultipartLimits,
        handler: fn(E, &mut crate::Multipart) -> Result<R, Error>,
    ) -> &mut Self {
        self.add_multipart(limits, handler);
        self
    }

    fn add_multipart<E: Event + Send, R: Reply + 'static>(
        &mut self,
        limits: crate::MultipartLimits,
        handler: impl Fn(E, &mut crate::Multipart) -> Result<R, Error> + Send + Sync + 'static,
    ) {
        let event_type = self.declare_with::<E>(true);
        // Its fields are the form's leading text fields (decision 0125).
        self.document::<E, R>(TypeRole::Form);
        self.requests.remove(&event_type);
        let handler = Arc::new(handler);
        self.uploads.insert(
            event_type,
            Box::new(move |request, body, format| {
                // The event needs the form's fields: it is decoded on the
                // upload's thread, from a copy of the request's meta.
                let mut meta = request.meta.clone();
                let content_type = meta.get("content-type").map(str::to_owned);
                let caller = request.caller();
                let handler = handler.clone();
                Ok(Box::new(move || {
                    let mut form = crate::multipart::Multipart::new(body, content_type.as_deref(), limits)?;
                    let fields = form.leading_fields()?;
                    meta.0.retain(|(k, _)| k != "content-type");
                    meta.push("content-type", crate::JSON);
                    let body = serde_json::to_vec(&fields)
                        .map_err(|e| Error::internal(format!("cannot re-encode form fields: {e}")))?;
                    let event = decode::<E>(&Request::from_caller(&meta, &body, caller))?;
                    handler(event, &mut form)?.into_response(format)
                }))
            }),
        );
    }

    /// A job function for job type `J`: what the manager's worker pool runs
    /// when a handler calls [`Context::spawn_job`] with a `J`. It gets no
    /// manager state (it may run on another thread or in a worker process),
    /// only the job; its result `R` travels back as bincode. A panic in it
    /// fails that job with 500.
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// # use switchyard_manager::{Error, Event, Registry, Manager, Config};
    /// #[derive(Serialize, Deserialize, Event)]
    /// #[event(name = "demo.Fib")]
    /// struct Fib { n: u32 }
    ///
    /// fn fib(job: Fib) -> Result<u64, Error> {
    ///     let (mut a, mut b) = (0u64, 1u64);
    ///     for _ in 0..job.n { (a, b) = (b, a.wrapping_add(b)); }
    ///     Ok(a)
    /// }
    /// # struct M;
    /// # impl Manager for M {
    /// #     const NAME: &'static str = "m";
    /// #     fn create(_: &Config) -> Result<Self, Error> { Ok(M) }
    /// fn register(r: &mut Registry<Self>) { r.job(fib); }
    /// # }
    /// ```
    pub fn job<J: Event, R: Serialize + DeserializeOwned + 'static>(
        &mut self,
        f: fn(J) -> Result<R, Error>,
    ) -> &mut Self {
        self.jobs.insert(
            EventType::of(J::NAME),
            Arc::new(move |input: &[u8]| {
                let job: J = codec::decode_local(input)
                    .map_err(|e| Error::bad_request(format!("bad input for job {}: {e}", J::NAME)))?;
                let result = f(job)?;
                codec::encode(&result)
                    .map_err(|e| Error::internal(format!("cannot encode the result of job {}: {e}", J::NAME)))
            }),
        );
        self
    }

    /// A periodic handler: runs every `interval(&manager)` (read once, right
    /// after `create`, so it may come from the manager's config), with the
    /// manager's state, between events. The host steps the timers when the
    /// earliest is due (the SDK tells it after every step), so an idle
    /// manager sleeps until then; a timer that fell far behind (the process
    /// was stopped) skips the missed runs.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use switchyard_manager::{Config, Context, Error, Manager, Registry};
    /// struct Beat { every: Duration, beats: u64 }
    /// impl Manager for Beat {
    ///     const NAME: &'static str = "beat";
    ///     fn create(_: &Config) -> Result<Self, Error> {
    ///         Ok(Beat { every: Duration::from_secs(1), beats: 0 })
    ///     }
    ///     fn register(r: &mut Registry<Self>) {
    ///         r.every(|m| m.every, |m, _cx| { m.beats += 1; Ok(()) });
    ///     }
    /// }
    /// ```
    pub fn every(&mut self, interval: fn(&M) -> std::time::Duration, handler: TimerFn<M>) -> &mut Self {
        self.timers.push(Timer { interval, handler });
        self
    }

    /// A handler for notifications of type `E` (subscribes the manager to them).
    pub fn on<E: Event>(&mut self, handler: fn(&mut M, E, &mut Context) -> Result<(), Error>) -> &mut Self {
        let event_type = EventType::of(E::NAME);
        self.document::<E, ()>(TypeRole::Notification);
        self.declare_notification::<E>();
        if !self.subscribes.contains(&event_type) {
            self.subscribes.push(event_type);
        }
        self.notifications.insert(
            event_type,
            Box::new(move |manager, request, cx| {
                let event = decode::<E>(request)?;
                let scope = crate::trace::scope_of(cx);
                crate::trace::scoped(scope, || handler(manager, event, cx))
            }),
        );
        self
    }
}
