//! Example application: a support desk whose tickets live in PostgreSQL.
//!
//! Two managers, one plugin:
//!
//! - `tickets`: `POST /tickets` (JSON, or the HTML form of `GET /tickets`)
//!   validates the ticket (422 with the invalid fields), asks `staff` whom
//!   to assign it to (a call to a second manager), stores it, announces
//!   `ticket.opened` (WebSocket and gRPC subscribers get it), schedules a
//!   reminder with the built-in Scheduler, and posts the ticket to a
//!   webhook with reqwest. `GET /tickets/{id}` reads one back (JSON, or an
//!   HTML page); `POST /tickets/{id}/close` needs a JWT (the rule is in
//!   `switchyard.toml`) and records who closed it. The reminder's firing
//!   (`tickets.Remind`) announces `ticket.reminder` for a ticket still open.
//! - `staff`: assigns tickets to the configured people in turn.
//!
//! The database is reached with tokio-postgres through a deadpool pool made
//! in `create`, on the plugin's tokio runtime (decision 0120); the schema
//! is `migrations/`, applied in `create` (`migrate.rs`). Every handler is
//! typed, so gRPC clients get `tickets.v1.Tickets` with integer ids.
//!
//! Run it: see `examples/tickets/README.md`.

#![forbid(unsafe_code)]

mod migrate;

use std::time::Duration;

use deadpool_postgres::{ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde::{Deserialize, Serialize};
use switchyard_manager::scheduler::Job;
use switchyard_manager::{
    Config, Context, Created, Error, Event, Identity, Invalid, Manager, Registry, Reply, State, tracing,
};
use tokio_postgres::{NoTls, Row};

/// `POST /tickets`: `{"title": "...", "body": "...", "email": "..."}`, or
/// the same fields from an HTML form.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "tickets.Open", http = "POST /tickets", template = "opened.html", reply = Created<Ticket>)]
pub struct Open {
    /// What is wrong, in a line.
    #[validate(length(min = 3, max = 120))]
    pub title: String,
    /// The details.
    #[serde(default)]
    #[validate(length(max = 4000))]
    pub body: String,
    /// Where to answer.
    #[validate(length(min = 3, max = 254))]
    pub email: String,
}

/// `GET /tickets/{id}`.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "tickets.Get", http = "GET /tickets/{id}", template = "ticket.html", reply = Ticket)]
pub struct Get {
    pub id: i64,
}

/// `GET /tickets`: the open tickets, and (as HTML) the form that opens one.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "tickets.List", http = "GET /tickets", template = "tickets.html", reply = Tickets)]
pub struct List {}

/// `POST /tickets/{id}/close`: staff only (a JWT, by the configuration's
/// `[[auth.rules]]`); the token's subject is recorded.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "tickets.Close", http = "POST /tickets/{id}/close", reply = Ticket)]
pub struct Close {
    pub id: i64,
    /// Who closed it: declared and read in one place (a request without
    /// an identity is answered 401 before the handler runs).
    #[from(identity)]
    pub by: Identity,
}

/// Fired by the Scheduler `remind_after_ms` after a ticket was opened.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "tickets.Remind", reply = Reminded)]
pub struct Remind {
    pub job: String,
    pub planned_ms: u64,
    pub payload: Reminder,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Reminder {
    pub id: i64,
}

/// Asks `staff` whom a new ticket goes to (internal: managers only).
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "staff.Assign", reply = Assigned)]
pub struct Assign {
    pub title: String,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Assigned {
    pub assignee: String,
}

/// A ticket. Also the items of `Tickets` and the body of `Created<Ticket>`:
/// a `Reply` struct is described by its fields wherever it is nested, so
/// typed gRPC clients get its id as an integer (decision 0122).
#[derive(Clone, Debug, Serialize, Deserialize, Reply)]
pub struct Ticket {
    pub id: i64,
    pub title: String,
    pub body: String,
    pub email: String,
    pub assignee: String,
    /// `open` or `closed`.
    pub status: String,
    pub closed_by: Option<String>,
    pub reminded: bool,
}

/// A reminder's firing: whether it was announced.
#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Reminded {
    pub announced: bool,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Tickets {
    pub tickets: Vec<Ticket>,
}

/// Notification: a ticket was opened.
#[derive(Clone, Debug, Serialize, Deserialize, Event)]
#[event(name = "ticket.opened")]
pub struct TicketOpened {
    pub id: i64,
    pub title: String,
    pub assignee: String,
}

/// Notification: a ticket is still open `remind_after_ms` after it was.
#[derive(Clone, Debug, Serialize, Deserialize, Event)]
#[event(name = "ticket.reminder")]
pub struct TicketReminder {
    pub id: i64,
    pub title: String,
    pub assignee: String,
}

/// The `tickets` manager's `[managers.config]`.
#[derive(Deserialize)]
struct Settings {
    /// A libpq connection string or URL.
    database: String,
    /// Where each new ticket is posted (JSON); none: not posted.
    #[serde(default)]
    webhook: Option<String>,
    #[serde(default = "Settings::default_remind_after_ms")]
    remind_after_ms: u64,
    #[serde(default = "Settings::default_pool_size")]
    pool_size: usize,
}

impl Settings {
    fn default_remind_after_ms() -> u64 {
        24 * 3600 * 1000
    }
    fn default_pool_size() -> usize {
        8
    }
}

/// The `tickets` manager.
pub struct TicketDesk {
    db: Pool,
    http: reqwest::Client,
    webhook: Option<String>,
    remind_after: Duration,
}

fn db(err: impl std::fmt::Display) -> Error {
    Error::unavailable(format!("database: {err}"))
}

const COLUMNS: &str = "id, title, body, email, assignee, status, closed_by, reminded";

fn ticket(row: &Row) -> Ticket {
    Ticket {
        id: row.get("id"),
        title: row.get("title"),
        body: row.get("body"),
        email: row.get("email"),
        assignee: row.get("assignee"),
        status: row.get("status"),
        closed_by: row.get("closed_by"),
        reminded: row.get("reminded"),
    }
}

impl Manager for TicketDesk {
    const NAME: &'static str = "tickets";

    fn create(config: &Config) -> Result<Self, Error> {
        let settings: Settings = config.get()?;
        let pg: tokio_postgres::Config = settings
            .database
            .parse()
            .map_err(|e| Error::bad_request(format!("config: database: {e}")))?;
        let manager = deadpool_postgres::Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let db = Pool::builder(manager)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(db)?;
        if !config.validation {
            // `create` is synchronous and outside any executor: it blocks
            // on the plugin's runtime until the schema is current.
            tokio::runtime::Handle::current().block_on(migrate::run(&db))?;
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        Ok(TicketDesk {
            db,
            http,
            webhook: settings.webhook,
            remind_after: Duration::from_millis(settings.remind_after_ms),
        })
    }

    fn register(r: &mut Registry<Self>) {
        r.handle(Self::open)
            .handle(Self::get)
            .handle(Self::list)
            .handle(Self::close)
            .handle(Self::remind)
            .emits::<TicketOpened>()
            .emits::<TicketReminder>();
    }
}

impl TicketDesk {
    async fn open(state: State<Self>, ev: Open, cx: Context) -> Result<Created<Ticket>, Error> {
        // What the derive cannot say: the address's shape.
        let mut invalid = Invalid::default();
        if !ev
            .email
            .split_once('@')
            .is_some_and(|(user, host)| !user.is_empty() && host.contains('.'))
        {
            invalid.add("email", "is not an email address");
        }
        if ev.title.trim().is_empty() {
            invalid.add("title", "is blank");
        }
        invalid.into_result()?;

        let (db, http, webhook, remind_after) =
            state.with(|m| (m.db.clone(), m.http.clone(), m.webhook.clone(), m.remind_after));
        let Assigned { assignee } = cx
            .call(&Assign {
                title: ev.title.clone(),
            })
            .await?;
        let client = db.get().await.map_err(self::db)?;
        let row = client
            .query_one(
                &format!(
                    "INSERT INTO tickets (title, body, email, assignee) VALUES ($1, $2, $3, $4) RETURNING {COLUMNS}"
                ),
                &[&ev.title, &ev.body, &ev.email, &assignee],
            )
            .await
            .map_err(self::db)?;
        drop(client);
        let ticket = ticket(&row);

        cx.notify(&TicketOpened {
            id: ticket.id,
            title: ticket.title.clone(),
            assignee: ticket.assignee.clone(),
        })?;
        let job = Job::after(remind_after)
            .id(&format!("ticket-{}-reminder", ticket.id))
            .request::<Remind>(&Reminder { id: ticket.id })?;
        cx.scheduler().schedule(job).await?;
        if let Some(url) = webhook {
            // The ticket is stored whatever the webhook says: its failure
            // is logged, not the client's.
            let posted = http
                .post(&url)
                .json(&ticket)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status);
            if let Err(err) = posted {
                tracing::warn!(%url, %err, "webhook not posted");
            }
        }
        Ok(Created::at(format!("/tickets/{}", ticket.id), ticket))
    }

    async fn get(state: State<Self>, ev: Get, _: Context) -> Result<Ticket, Error> {
        let db = state.with(|m| m.db.clone());
        let client = db.get().await.map_err(self::db)?;
        let row = client
            .query_opt(&format!("SELECT {COLUMNS} FROM tickets WHERE id = $1"), &[&ev.id])
            .await
            .map_err(self::db)?
            .ok_or_else(|| Error::not_found(format!("no ticket {}", ev.id)))?;
        Ok(ticket(&row))
    }

    async fn list(state: State<Self>, _: List, _: Context) -> Result<Tickets, Error> {
        let db = state.with(|m| m.db.clone());
        let client = db.get().await.map_err(self::db)?;
        let rows = client
            .query(
                &format!("SELECT {COLUMNS} FROM tickets WHERE status = 'open' ORDER BY id DESC LIMIT 100"),
                &[],
            )
            .await
            .map_err(self::db)?;
        Ok(Tickets {
            tickets: rows.iter().map(ticket).collect(),
        })
    }

    async fn close(state: State<Self>, ev: Close, _: Context) -> Result<Ticket, Error> {
        let who = ev.by.sub;
        let db = state.with(|m| m.db.clone());
        let client = db.get().await.map_err(self::db)?;
        let row = client
            .query_opt(
                &format!(
                    "UPDATE tickets SET status = 'closed', closed_by = $2 WHERE id = $1 AND status = 'open' RETURNING {COLUMNS}"
                ),
                &[&ev.id, &who],
            )
            .await
            .map_err(self::db)?;
        match row {
            Some(row) => Ok(ticket(&row)),
            None => {
                let exists = client
                    .query_opt("SELECT 1 FROM tickets WHERE id = $1", &[&ev.id])
                    .await
                    .map_err(self::db)?;
                Err(match exists {
                    Some(_) => Error::conflict(format!("ticket {} is already closed", ev.id)),
                    None => Error::not_found(format!("no ticket {}", ev.id)),
                })
            }
        }
    }

    /// The reminder's firing: announced once, and only for a ticket still
    /// open (the Scheduler delivers at least once). A closed or reminded
    /// ticket is a firing done, not an error the Scheduler would retry.
    async fn remind(state: State<Self>, ev: Remind, cx: Context) -> Result<Reminded, Error> {
        let db = state.with(|m| m.db.clone());
        let client = db.get().await.map_err(self::db)?;
        let row = client
            .query_opt(
                &format!(
                    "UPDATE tickets SET reminded = true WHERE id = $1 AND status = 'open' AND NOT reminded RETURNING {COLUMNS}"
                ),
                &[&ev.payload.id],
            )
            .await
            .map_err(self::db)?;
        let Some(row) = row else {
            return Ok(Reminded { announced: false });
        };
        let ticket = ticket(&row);
        cx.notify(&TicketReminder {
            id: ticket.id,
            title: ticket.title,
            assignee: ticket.assignee,
        })?;
        Ok(Reminded { announced: true })
    }
}

/// The `staff` manager: the configured people, in turn.
pub struct Staff {
    people: Vec<String>,
    next: usize,
}

#[derive(Deserialize)]
struct StaffSettings {
    people: Vec<String>,
}

impl Manager for Staff {
    const NAME: &'static str = "staff";

    fn create(config: &Config) -> Result<Self, Error> {
        let settings: StaffSettings = config.get()?;
        if settings.people.is_empty() {
            return Err(Error::bad_request("config: people must name someone"));
        }
        Ok(Staff {
            people: settings.people,
            next: 0,
        })
    }

    fn register(r: &mut Registry<Self>) {
        r.handle(Self::assign);
    }
}

impl Staff {
    fn assign(&mut self, _: Assign, _: &mut Context) -> Result<Assigned, Error> {
        let assignee = self.people[self.next % self.people.len()].clone();
        self.next = self.next.wrapping_add(1);
        Ok(Assigned { assignee })
    }
}

switchyard_manager::export_managers!(TicketDesk, Staff);
