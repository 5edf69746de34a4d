//! How the kernel connects to PostgreSQL: the URL it was given, and the bounds every connection
//! carries, so that no replica waits on the database for longer than the lease TTL whatever
//! another replica does. A replica frozen inside a transaction (a stopped process, a paused VM, a
//! cut network) would otherwise hold its locks until TCP keepalive gave up, hours later: the
//! server ends its session after `idle_in_transaction_session_timeout`, a lock waited for longer
//! than `lock_timeout` fails the statement, and keepalives with a TCP user timeout notice a dead
//! peer from either side.

use std::time::Duration;

use tokio_postgres::Config;

use crate::error::KernelError;

/// The longest a session may sit idle inside a transaction, whatever the lease TTL.
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(2);

/// The bounds on one connection's waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// How long the server lets a session sit inside a transaction with no statement running
    /// before it ends the session (and with it the transaction and its locks).
    pub idle_in_transaction: Duration,
    /// How long a statement waits for a lock before it fails.
    pub lock: Duration,
    /// How long a statement may run.
    pub statement: Duration,
    /// How long a connection may go unanswered (its keepalives and unacknowledged sends) before
    /// it counts as dead, and how long connecting may take.
    pub silence: Duration,
}

impl Bounds {
    /// The bounds for replicas whose leases last `lease_ttl`. A session idle inside a transaction
    /// for a TTL, and never more than [`IDLE_IN_TRANSACTION`], is ended: the writer's transactions
    /// last milliseconds, and the locks a frozen replica holds hold up every other replica. A lock
    /// is waited for two TTLs, long enough for a frozen holder to be ended first.
    pub fn for_lease_ttl(lease_ttl: Duration, statement: Duration) -> Bounds {
        let ttl = lease_ttl.max(Duration::from_secs(1));
        Bounds {
            idle_in_transaction: ttl.min(IDLE_IN_TRANSACTION),
            lock: ttl * 2,
            statement,
            silence: ttl,
        }
    }
}

impl Default for Bounds {
    /// The bounds at the default lease TTL (10 s) and statement timeout (60 s).
    fn default() -> Self {
        Bounds::for_lease_ttl(Duration::from_secs(10), Duration::from_secs(60))
    }
}

/// What a connection is for: each sets the server's limits it can live with, and names itself in
/// `pg_stat_activity` so an operator can tell the kernel's sessions apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The writer's connection: every bound applies.
    Writer,
    /// A pooled reader's.
    Reader,
    /// The commit feed's, which listens for notices, and progress's, which sends them.
    Feed,
    /// Migrations, which wait for each other's advisory lock and may rewrite big tables: no lock
    /// or statement timeout.
    Migrate,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Writer => "writer",
            Role::Reader => "reader",
            Role::Feed => "feed",
            Role::Migrate => "migrate",
        }
    }
}

/// A PostgreSQL database and the bounds the kernel's connections to it carry.
#[derive(Clone, Debug)]
pub struct Target {
    base: Config,
    bounds: Bounds,
}

impl Target {
    /// `url` (a `postgres://` connection URL) with `bounds`.
    pub fn new(url: &str, bounds: Bounds) -> Result<Target, KernelError> {
        let base = url
            .parse()
            .map_err(|error| KernelError::FailedPrecondition(format!("invalid PostgreSQL URL: {error}")))?;
        Ok(Target { base, bounds })
    }

    /// `url` with the default bounds.
    pub fn with_defaults(url: &str) -> Result<Target, KernelError> {
        Target::new(url, Bounds::default())
    }

    /// The driver's configuration for a connection of `role`, named after `replica`. Options the
    /// URL sets itself come after the kernel's, so they win.
    pub fn config(&self, role: Role, replica: &str) -> Config {
        let mut config = self.base.clone();
        let bounds = &self.bounds;
        let millis = |d: Duration| d.as_millis();
        let mut options = format!(
            "-c idle_in_transaction_session_timeout={}",
            millis(bounds.idle_in_transaction)
        );
        if role != Role::Migrate {
            options.push_str(&format!(
                " -c lock_timeout={} -c statement_timeout={}",
                millis(bounds.lock),
                millis(bounds.statement)
            ));
        }
        if let Some(own) = config.get_options() {
            options = format!("{options} {own}");
        }
        // Keepalives every third of the silence allowed, three unanswered make the connection
        // dead; the TCP user timeout does the same for data sent and never acknowledged.
        let probe = (bounds.silence / 3).max(Duration::from_secs(1));
        config
            .options(options)
            // At most 51 bytes: PostgreSQL cuts names at 63.
            .application_name(format!("kernel {} {replica}", role.name()))
            .connect_timeout(bounds.silence)
            .keepalives(true)
            .keepalives_idle(probe)
            .keepalives_interval(probe)
            .keepalives_retries(3)
            .tcp_user_timeout(bounds.silence);
        config
    }

    /// Connects as `role`; the connection's task runs on the caller's runtime until the client
    /// drops.
    pub async fn connect(&self, role: Role, replica: &str) -> Result<tokio_postgres::Client, KernelError> {
        let (client, connection) = self
            .config(role, replica)
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|error| super::unavailable("cannot connect to PostgreSQL", &error))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "postgresql connection ended");
            }
        });
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_but_migrations_carries_the_lock_and_statement_timeouts() {
        let target = Target::new(
            "postgres://kernel@localhost/db?options=-c%20work_mem%3D8MB",
            Bounds::for_lease_ttl(Duration::from_millis(1_500), Duration::from_secs(60)),
        )
        .unwrap();
        let writer = target.config(Role::Writer, "0193-abcd");
        assert_eq!(
            writer.get_options(),
            Some(
                "-c idle_in_transaction_session_timeout=1500 -c lock_timeout=3000 -c statement_timeout=60000 \
                 -c work_mem=8MB"
            )
        );
        assert_eq!(writer.get_application_name(), Some("kernel writer 0193-abcd"));
        assert_eq!(writer.get_connect_timeout(), Some(&Duration::from_millis(1_500)));
        assert!(writer.get_keepalives());
        assert_eq!(writer.get_keepalives_idle(), Duration::from_secs(1));
        let migrate = target.config(Role::Migrate, "0193-abcd");
        assert_eq!(
            migrate.get_options(),
            Some("-c idle_in_transaction_session_timeout=1500 -c work_mem=8MB")
        );
    }

    #[test]
    fn a_session_idle_inside_a_transaction_is_ended_within_two_seconds_whatever_the_ttl() {
        let bounds = Bounds::default();
        assert_eq!(bounds.idle_in_transaction, Duration::from_secs(2));
        assert_eq!(bounds.lock, Duration::from_secs(20));
        assert_eq!(bounds.silence, Duration::from_secs(10));
    }

    #[test]
    fn a_lease_under_a_second_is_bounded_as_a_second() {
        let bounds = Bounds::for_lease_ttl(Duration::from_millis(100), Duration::from_secs(5));
        assert_eq!(bounds.idle_in_transaction, Duration::from_secs(1));
        assert_eq!(bounds.lock, Duration::from_secs(2));
    }
}
