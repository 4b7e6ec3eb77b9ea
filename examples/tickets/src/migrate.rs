//! The schema: `migrations/NNNN_name.sql`, applied in order, each once.
//!
//! `schema_version` records the last one applied. The whole run is one
//! transaction under an advisory lock, so instances starting together
//! migrate once, and a failing migration leaves the schema as it was.

use deadpool_postgres::Pool;
use switchyard_manager::Error;

/// In order; a migration, once released, is never edited: add another.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "tickets", include_str!("../migrations/0001_tickets.sql")),
    (
        2,
        "close and remind",
        include_str!("../migrations/0002_close_and_remind.sql"),
    ),
];

/// Any number: this application's lock among the database's users.
const LOCK: i64 = 0x7469_636b_6574;

fn failed(step: &str) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
    move |err| Error::unavailable(format!("migration {step}: {err}"))
}

/// Brings the schema up to date.
pub(crate) async fn run(pool: &Pool) -> Result<(), Error> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| Error::unavailable(format!("database: {e}")))?;
    let tx = client.transaction().await.map_err(failed("begin"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await
        .map_err(failed("lock"))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version INT NOT NULL)")
        .await
        .map_err(failed("schema_version"))?;
    let current: i32 = tx
        .query_opt("SELECT version FROM schema_version", &[])
        .await
        .map_err(failed("schema_version"))?
        .map_or(0, |row| row.get(0));
    for &(version, name, sql) in MIGRATIONS.iter().filter(|(v, ..)| *v > current) {
        tx.batch_execute(sql).await.map_err(failed(name))?;
        tx.execute("DELETE FROM schema_version", &[])
            .await
            .map_err(failed(name))?;
        tx.execute("INSERT INTO schema_version (version) VALUES ($1)", &[&version])
            .await
            .map_err(failed(name))?;
    }
    tx.commit().await.map_err(failed("commit"))?;
    Ok(())
}
