//! The PostgreSQL store: its schema and migrations, applied under an advisory lock so that
//! replicas starting together do not race (the first applies them, the others wait for it and
//! find nothing left to do).

pub mod notice;
mod schema;
mod target;

pub use target::{Bounds, Role, Target};

use tokio_postgres::Client;
use tracing::info;

use super::Migrated;
use super::sql::describe;
use crate::clock::Clock;
use crate::error::KernelError;

/// The advisory lock migrations run under: one number, the same in every replica.
const MIGRATION_LOCK: i64 = 0x6b65_726e_656c_0001;

/// The schema version this build writes on PostgreSQL.
pub fn latest() -> usize {
    schema::MIGRATIONS.len()
}

/// Brings the database to this build's newest schema, each migration in its own transaction,
/// under the migration lock. Refuses a database a newer build migrated.
pub async fn migrate(client: &mut Client) -> Result<Migrated, KernelError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|error| store("cannot take the migration lock", &error))?;
    let migrated = apply(client).await;
    // Released on every path; a connection that dies releases it too.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let migrated = migrated?;
    unlocked.map_err(|error| store("cannot release the migration lock", &error))?;
    Ok(migrated)
}

async fn apply(client: &mut Client) -> Result<Migrated, KernelError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS kernel_schema (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )
        .await
        .map_err(|error| store("cannot create kernel_schema", &error))?;
    let current: i64 = client
        .query_one("SELECT COALESCE(MAX(version), 0) FROM kernel_schema", &[])
        .await
        .map_err(|error| store("cannot read the schema version", &error))?
        .get(0);
    let from = usize::try_from(current).unwrap_or(usize::MAX);
    if from > latest() {
        return Err(KernelError::FailedPrecondition(format!(
            "the database's schema is at version {from}, newer than this kernel's {}: upgrade the kernel",
            latest()
        )));
    }
    for (index, sql) in schema::MIGRATIONS.iter().enumerate().skip(from) {
        let version = (index + 1) as i64;
        let tx = client
            .transaction()
            .await
            .map_err(|error| store("cannot begin a migration", &error))?;
        tx.batch_execute(sql)
            .await
            .map_err(|error| store(&format!("migration {version} failed"), &error))?;
        tx.execute(
            "INSERT INTO kernel_schema (version, applied_at) VALUES ($1, $2)",
            &[&version, &Clock::wall().now_millis()],
        )
        .await
        .map_err(|error| store(&format!("cannot record migration {version}"), &error))?;
        tx.commit()
            .await
            .map_err(|error| store(&format!("cannot commit migration {version}"), &error))?;
        info!(version, "postgresql migration applied");
    }
    Ok(Migrated { from, to: latest() })
}

/// The writer's connection, used from the writer thread (it drives itself on a runtime of its own
/// while a statement waits, and pipelines the writes nobody waits for).
pub(super) fn open_writer(target: &Target, replica: &str) -> Result<super::sql::PgConn, KernelError> {
    super::sql::PgConn::connect(&target.config(Role::Writer, replica))
        .map_err(|error| unavailable("cannot connect to PostgreSQL", &error))
}

fn unavailable(what: &str, error: &tokio_postgres::Error) -> KernelError {
    KernelError::Unavailable(format!("{what}: {}", describe(error)))
}

fn store(what: &str, error: &tokio_postgres::Error) -> KernelError {
    KernelError::Store(format!("{what}: {}", describe(error)))
}
