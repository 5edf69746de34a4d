//! The SQL the store's operations speak, in the shape of rusqlite's API (`prepare_cached`,
//! `execute`, `query_row`, `query_map`, `optional`, `params!`, `row.get`), so the operations are
//! written once for every backend: statements with `?N` parameters, arguments as [`Arg`]s, and
//! rows read by index into the kernel's types through [`FromCell`].
//!
//! Behind it is SQLite, or PostgreSQL: there each statement's `?N` (and bare `?`) become `$N`
//! once, the prepared statement is kept per connection, and each [`Arg`] is bound as the type the
//! server gave its parameter.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;

use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

/// What a statement failed with.
#[derive(Debug)]
pub enum Error {
    /// A query that expected a row got none ([`OptionalExtension::optional`] makes it `None`).
    NoRows,
    /// The backend's own message.
    Backend(String),
    /// The database cannot be reached (a PostgreSQL connection dropped or refused).
    Unavailable(String),
    /// SQLite's lock was not free within the connection's busy timeout.
    Busy(String),
}

impl Error {
    /// A column whose stored text does not parse as the kernel's type.
    pub fn conversion(index: usize, message: impl fmt::Display) -> Self {
        Error::Backend(format!("column {index}: {message}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoRows => f.write_str("query returned no rows"),
            Error::Backend(message) | Error::Unavailable(message) | Error::Busy(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        match error {
            rusqlite::Error::QueryReturnedNoRows => Error::NoRows,
            other if other.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                Error::Busy(other.to_string())
            }
            other => Error::Backend(other.to_string()),
        }
    }
}

impl From<postgres::Error> for Error {
    fn from(error: postgres::Error) -> Self {
        match error.as_db_error() {
            Some(_) => Error::Backend(describe(&error)),
            // No answer from the server: the connection, not the statement, failed.
            None => Error::Unavailable(format!("the database is unreachable: {error}")),
        }
    }
}

/// The server's own message and SQLSTATE when there is one (the driver's `Display` says only
/// "db error").
pub fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}

impl From<Error> for crate::error::KernelError {
    fn from(error: Error) -> Self {
        match error {
            Error::Unavailable(message) => crate::error::KernelError::Unavailable(message),
            other => crate::error::KernelError::Store(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// One statement argument, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
}

/// A value that can be a statement argument.
pub trait ToArg {
    fn to_arg(&self) -> Arg<'_>;
}

impl<T: ToArg + ?Sized> ToArg for &T {
    fn to_arg(&self) -> Arg<'_> {
        (**self).to_arg()
    }
}

impl ToArg for str {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}

impl ToArg for String {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self)
    }
}

macro_rules! id_args {
    ($($t:ty),*) => {$(
        impl ToArg for $t {
            fn to_arg(&self) -> Arg<'_> {
                Arg::Text(self.as_str())
            }
        }
    )*};
}
id_args!(
    crate::model::RunId,
    crate::model::DispatchId,
    crate::model::SessionId,
    crate::model::ApprovalId
);

impl<T: ToArg> ToArg for Option<T> {
    fn to_arg(&self) -> Arg<'_> {
        match self {
            Some(value) => value.to_arg(),
            None => Arg::Null,
        }
    }
}

impl ToArg for f64 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Real(*self)
    }
}

impl ToArg for bool {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(i64::from(*self))
    }
}

macro_rules! int_args {
    ($($t:ty),*) => {$(
        impl ToArg for $t {
            fn to_arg(&self) -> Arg<'_> {
                // The kernel's counters and times fit an i64; a u64 beyond it is a bug upstream.
                Arg::Int(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
int_args!(i64, i32, u32, u64, usize);

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(value) => ValueRef::Integer(value),
            Arg::Real(value) => ValueRef::Real(value),
            Arg::Text(text) => ValueRef::Text(text.as_bytes()),
        }))
    }
}

impl ToSql for Arg<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match *self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(value) => match *ty {
                Type::INT8 => value.to_sql(ty, out),
                Type::INT4 => i32::try_from(value)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(value)?.to_sql(ty, out),
                Type::FLOAT8 => (value as f64).to_sql(ty, out),
                Type::BOOL => (value != 0).to_sql(ty, out),
                _ => Err(format!("an integer cannot be bound to a {ty} parameter").into()),
            },
            Arg::Real(value) => match *ty {
                Type::FLOAT8 => value.to_sql(ty, out),
                Type::FLOAT4 => (value as f32).to_sql(ty, out),
                _ => Err(format!("a real cannot be bound to a {ty} parameter").into()),
            },
            Arg::Text(text) => text.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// Arguments for a statement, each borrowed: `params![run.as_str(), step.attempts]`.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        &[$($crate::store::sql::ToArg::to_arg(&$value)),*][..]
    };
}
pub(crate) use params;

/// A column value the kernel reads: SQLite's integer, real or text, or PostgreSQL's `BIGINT`,
/// `DOUBLE PRECISION` or `TEXT` (the kernel's flags and counters are `BIGINT` there).
pub trait FromCell: Sized {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self>;
    fn from_postgres(row: &postgres::Row, index: usize) -> Result<Self>;
}

/// Implements [`FromCell`] for `$t` and `Option<$t>`, read from PostgreSQL by `$read` (which
/// gives the column as an `Option<$pg>`) and converted by `$convert`.
macro_rules! cells {
    ($($t:ty => $pg:ty, $read:expr, $convert:expr;)*) => {$(
        impl FromCell for $t {
            fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
                row.get(index)
            }
            fn from_postgres(row: &postgres::Row, index: usize) -> Result<Self> {
                let value: Option<$pg> = $read(row, index)?;
                let value = value.ok_or_else(|| Error::conversion(index, "NULL where a value was expected"))?;
                $convert(value).map_err(|e| Error::conversion(index, e))
            }
        }
        impl FromCell for Option<$t> {
            fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
                row.get(index)
            }
            fn from_postgres(row: &postgres::Row, index: usize) -> Result<Self> {
                let value: Option<$pg> = $read(row, index)?;
                value.map($convert).transpose().map_err(|e| Error::conversion(index, e))
            }
        }
    )*};
}

fn same<T>(value: T) -> std::result::Result<T, String> {
    Ok(value)
}

fn typed<T: for<'a> postgres::types::FromSql<'a>>(row: &postgres::Row, index: usize) -> Result<Option<T>> {
    Ok(row.try_get(index)?)
}

/// An integer column whatever its width, or a boolean one (`SELECT EXISTS`) as 0 or 1: SQLite
/// has one integer type, and the kernel reads flags and counts as integers.
fn integer(row: &postgres::Row, index: usize) -> Result<Option<i64>> {
    let ty = row.columns().get(index).map(|c| c.type_().clone());
    Ok(match ty {
        Some(Type::INT2) => row.try_get::<_, Option<i16>>(index)?.map(i64::from),
        Some(Type::INT4) => row.try_get::<_, Option<i32>>(index)?.map(i64::from),
        Some(Type::BOOL) => row.try_get::<_, Option<bool>>(index)?.map(i64::from),
        _ => row.try_get::<_, Option<i64>>(index)?,
    })
}

cells! {
    String => String, typed, same;
    f64 => f64, typed, same;
    i64 => i64, integer, same;
    u32 => i64, integer, |v: i64| u32::try_from(v).map_err(|e| e.to_string());
    u64 => i64, integer, |v: i64| u64::try_from(v).map_err(|e| e.to_string());
    usize => i64, integer, |v: i64| usize::try_from(v).map_err(|e| e.to_string());
    bool => i64, integer, |v: i64| Ok::<bool, String>(v != 0);
}

/// Implements [`FromCell`] for an id and `Option` of it: the text column as it was written.
macro_rules! id_cells {
    ($($t:ty),*) => {$(
        impl FromCell for $t {
            fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
                row.get(index).map(<$t>::from_stored)
            }
            fn from_postgres(row: &postgres::Row, index: usize) -> Result<Self> {
                String::from_postgres(row, index).map(<$t>::from_stored)
            }
        }
        impl FromCell for Option<$t> {
            fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
                Ok(row.get::<_, Option<String>>(index)?.map(<$t>::from_stored))
            }
            fn from_postgres(row: &postgres::Row, index: usize) -> Result<Self> {
                Ok(Option::<String>::from_postgres(row, index)?.map(<$t>::from_stored))
            }
        }
    )*};
}

id_cells!(
    crate::model::DispatchId,
    crate::model::SessionId,
    crate::model::ApprovalId
);

/// One row of a result.
pub enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r postgres::Row),
}

impl Row<'_> {
    /// Column `index` as `T`.
    pub fn get<T: FromCell>(&self, index: usize) -> Result<T> {
        match self {
            Row::Sqlite(row) => Ok(T::from_sqlite(row, index)?),
            Row::Postgres(row) => T::from_postgres(row, index),
        }
    }
}

/// Which SQL a connection speaks, for the few statements that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A PostgreSQL connection with its prepared statements, used from one thread at a time.
///
/// Writes whose answer nobody reads ([`Connection::write`]) are not sent at once: they wait and
/// go out with the next statement someone waits for, in one round trip (tokio-postgres pipelines
/// requests sent before their answers are read). The server runs them in the order written, so a
/// read after a deferred write sees it; an error in a deferred write is the error of the statement
/// that sent it.
pub struct PgConn {
    /// Drives the connection while a statement waits (the client is asynchronous; the writer
    /// and the readers are blocking threads).
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    statements: RefCell<HashMap<String, postgres::Statement>>,
    /// Writes not sent yet, each with the command that wrote it.
    deferred: RefCell<Vec<(usize, Deferred)>>,
    /// The writer's command now writing (numbered in its batch), under savepoint `c<N>`.
    command: Cell<usize>,
    /// Commands that had ended when one of their writes turned out to fail, with the error: they
    /// and every command after them in the batch are undone, and the writer answers them so
    /// ([`PgConn::take_undone`]).
    undone: RefCell<Vec<(usize, String)>>,
    /// The command now writing was undone with an earlier one: its savepoint is gone, and nothing
    /// more of it goes out.
    lost: Cell<bool>,
}

/// A write waiting to go out with the next statement waited for.
enum Deferred {
    Batch(String),
    Execute(postgres::Statement, Vec<OwnedArg>),
}

/// An [`Arg`] kept until its statement is sent.
#[derive(Debug)]
enum OwnedArg {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl OwnedArg {
    fn of(arg: &Arg<'_>) -> Self {
        match *arg {
            Arg::Null => OwnedArg::Null,
            Arg::Int(value) => OwnedArg::Int(value),
            Arg::Real(value) => OwnedArg::Real(value),
            Arg::Text(text) => OwnedArg::Text(text.to_owned()),
        }
    }

    fn arg(&self) -> Arg<'_> {
        match self {
            OwnedArg::Null => Arg::Null,
            OwnedArg::Int(value) => Arg::Int(*value),
            OwnedArg::Real(value) => Arg::Real(*value),
            OwnedArg::Text(text) => Arg::Text(text),
        }
    }
}

type Pending<'a> = futures_util::future::LocalBoxFuture<'a, std::result::Result<(), postgres::Error>>;

impl PgConn {
    /// Connects as `config` says.
    pub fn connect(config: &tokio_postgres::Config) -> std::result::Result<Self, postgres::Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds");
        let (client, connection) = runtime.block_on(config.connect(postgres::NoTls))?;
        runtime.spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "postgresql connection ended");
            }
        });
        Ok(PgConn {
            runtime,
            client,
            statements: RefCell::new(HashMap::new()),
            deferred: RefCell::new(Vec::new()),
            command: Cell::new(0),
            undone: RefCell::new(Vec::new()),
            lost: Cell::new(false),
        })
    }

    /// Whether the connection has dropped; it does not come back.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Runs statements that take no arguments (transaction control).
    pub fn batch(&self, sql: &str) -> Result<()> {
        self.send(|| self.client.batch_execute(sql))
    }

    /// Sends statements that take no arguments with the next statement waited for.
    pub fn defer_batch(&self, sql: &str) {
        self.push(Deferred::Batch(sql.to_owned()));
    }

    /// Starts writer command `index` under its own savepoint, sent with its first statement
    /// waited for.
    pub fn begin_command(&self, index: usize) {
        self.command.set(index);
        self.lost.set(false);
        self.defer_batch(&format!("SAVEPOINT c{index}"));
    }

    /// Ends the command that succeeded, without waiting: its release goes out with the next
    /// statement waited for. Should one of its writes fail then, the command is undone with the
    /// commands after it, named in [`PgConn::take_undone`].
    pub fn end_command(&self) {
        self.defer_batch(&format!("RELEASE SAVEPOINT c{}", self.command.get()));
    }

    /// Undoes the command that failed: its writes not sent yet are dropped, and those sent are
    /// rolled back to its savepoint (the writes of the commands before it stand).
    pub fn undo_command(&self) -> Result<()> {
        let index = self.command.get();
        if self.lost.get() {
            return Ok(());
        }
        let mut never_sent = false;
        self.deferred.borrow_mut().retain(|(command, deferred)| {
            let dropped = *command == index;
            never_sent |= dropped && matches!(deferred, Deferred::Batch(sql) if sql.starts_with("SAVEPOINT"));
            !dropped
        });
        if never_sent {
            return Ok(());
        }
        self.batch(&format!("ROLLBACK TO SAVEPOINT c{index}; RELEASE SAVEPOINT c{index}"))
    }

    /// Sends what is deferred and waits for it: after the last command of a batch, before the
    /// commit, so every command's writes are known good or undone when it commits.
    pub fn flush(&self) -> Result<()> {
        self.command.set(FLUSHING);
        self.lost.set(false);
        self.send(|| std::future::ready(Ok(())))
    }

    /// Each command found undone after it ended, with what failed it: it and every command after
    /// it up to the one then writing (or, found by [`PgConn::flush`], to the batch's last) were
    /// undone. Taken once.
    pub fn take_undone(&self) -> Vec<(usize, String)> {
        std::mem::take(&mut *self.undone.borrow_mut())
    }

    fn push(&self, deferred: Deferred) {
        if !self.lost.get() {
            self.deferred.borrow_mut().push((self.command.get(), deferred));
        }
    }

    fn statement(&self, sql: &str) -> Result<postgres::Statement> {
        if let Some(statement) = self.statements.borrow().get(sql) {
            return Ok(statement.clone());
        }
        let sql_text = postgres_sql(sql);
        let statement = self.send(|| self.client.prepare(&sql_text))?;
        self.statements.borrow_mut().insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    fn execute(&self, statement: &postgres::Statement, args: &[Arg<'_>]) -> Result<u64> {
        self.send(|| self.client.execute_raw(statement, args.iter()))
    }

    fn query(&self, statement: &postgres::Statement, args: &[Arg<'_>]) -> Result<Vec<postgres::Row>> {
        let args = pg_args(args);
        self.send(|| self.client.query(statement, &args))
    }

    fn defer(&self, statement: postgres::Statement, args: &[Arg<'_>]) {
        let args = args.iter().map(OwnedArg::of).collect();
        self.push(Deferred::Execute(statement, args));
    }

    /// Sends the deferred writes, then the statement `last` makes, in one go, and waits for all
    /// of their answers. A failed write of the command now writing is `last`'s error. One of a
    /// command that already ended undoes that command and every one after it, the one now writing
    /// included: they were applied on what it wrote (the writer's memory of its runs, event
    /// numbers after its own), so keeping them would keep numbers it never wrote.
    fn send<T, F>(&self, last: impl FnOnce() -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<T, postgres::Error>>,
    {
        if self.lost.get() {
            return Err(self.lost_error());
        }
        let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
        let client = &self.client;
        let earlier: Vec<Pending<'_>> = deferred.iter().map(|(_, deferred)| self.sending(deferred)).collect();
        let (earlier, last) = self.runtime.block_on(in_order(earlier, last()));
        let Some((at, error)) = earlier else {
            return Ok(last?);
        };
        let failed = deferred[at].0;
        let now = self.command.get();
        if failed == now || client.is_closed() {
            return Err(error.into());
        }
        // Everything sent after the failed write was rejected: the transaction had aborted.
        self.runtime
            .block_on(client.batch_execute(&format!("ROLLBACK TO SAVEPOINT c{failed}; RELEASE SAVEPOINT c{failed}")))?;
        self.undone.borrow_mut().push((failed, describe(&error)));
        if now == FLUSHING {
            return Ok(last?);
        }
        self.lost.set(true);
        Err(self.lost_error())
    }

    /// A deferred write on its way.
    fn sending<'a>(&'a self, deferred: &'a Deferred) -> Pending<'a> {
        match deferred {
            Deferred::Batch(sql) => Box::pin(self.client.batch_execute(sql)),
            Deferred::Execute(statement, args) => Box::pin(async move {
                self.client
                    .execute_raw(statement, args.iter().map(OwnedArg::arg))
                    .await
                    .map(drop)
            }),
        }
    }

    /// The answer to every statement of a command undone with an earlier one.
    fn lost_error(&self) -> Error {
        let (failed, error) = self.undone.borrow().last().cloned().unwrap_or_default();
        Error::Backend(format!(
            "undone with command {failed} of its batch, whose write failed after it ended: {error}"
        ))
    }
}

/// The writer's command number while [`PgConn::flush`] sends the batch's last writes.
const FLUSHING: usize = usize::MAX;

/// Polls `earlier` and then `last` in order, each time, until all are done: a request goes out on
/// its future's first poll, so they reach the server in this order. The first error of `earlier`,
/// with its place, is the one that counts (the statements after it fail only because the
/// transaction aborted).
async fn in_order<T>(
    earlier: Vec<Pending<'_>>,
    last: impl std::future::Future<Output = std::result::Result<T, postgres::Error>>,
) -> (
    Option<(usize, postgres::Error)>,
    std::result::Result<T, postgres::Error>,
) {
    use futures_util::future::{MaybeDone, maybe_done};
    use std::pin::Pin;
    use std::task::Poll;

    let mut earlier: Vec<MaybeDone<Pending<'_>>> = earlier.into_iter().map(maybe_done).collect();
    let mut last = std::pin::pin!(maybe_done(last));
    std::future::poll_fn(|cx| {
        let mut done = true;
        for future in earlier.iter_mut() {
            done &= Pin::new(future).poll(cx).is_ready();
        }
        done &= last.as_mut().poll(cx).is_ready();
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    let first_error = earlier
        .iter_mut()
        .map(|future| Pin::new(future).take_output().expect("polled to completion"))
        .enumerate()
        .find_map(|(at, result)| result.err().map(|error| (at, error)));
    let last = last.as_mut().take_output().expect("polled to completion");
    (first_error, last)
}

/// `?N` as `$N` and a bare `?` as the next number, outside string literals.
fn postgres_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let (mut quoted, mut last) = (false, 0u32);
    while let Some(c) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c != '?' || quoted {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let number = if digits.is_empty() {
            last + 1
        } else {
            digits.parse().unwrap_or(last + 1)
        };
        last = last.max(number);
        out.push('$');
        out.push_str(&number.to_string());
    }
    out
}

thread_local! {
    /// Statements this thread ran since it last took the count: the writer's thread reports its
    /// own after each batch; the readers' threads never do.
    static STATEMENTS: Cell<u64> = const { Cell::new(0) };
}

/// Counts one statement run on this thread.
pub fn count_statement() {
    STATEMENTS.with(|count| count.set(count.get() + 1));
}

/// The statements this thread ran since the last call.
pub fn take_statements() -> u64 {
    STATEMENTS.with(|count| count.replace(0))
}

/// A connection the operations run on.
#[derive(Clone, Copy)]
pub enum Connection<'c> {
    Sqlite(&'c rusqlite::Connection),
    Postgres(&'c PgConn),
}

impl<'c> Connection<'c> {
    /// The operations' view of a SQLite connection.
    pub fn sqlite(conn: &'c rusqlite::Connection) -> Self {
        Connection::Sqlite(conn)
    }

    /// The operations' view of a PostgreSQL connection.
    pub fn postgres(conn: &'c PgConn) -> Self {
        Connection::Postgres(conn)
    }

    /// Which SQL it speaks.
    pub fn dialect(&self) -> Dialect {
        match self {
            Connection::Sqlite(_) => Dialect::Sqlite,
            Connection::Postgres(_) => Dialect::Postgres,
        }
    }

    /// A statement, prepared once per connection and kept.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'c>> {
        count_statement();
        Ok(match self {
            Connection::Sqlite(conn) => Statement::Sqlite(conn.prepare_cached(sql)?),
            Connection::Postgres(conn) => Statement::Postgres {
                conn,
                statement: conn.statement(sql)?,
            },
        })
    }

    /// A statement built at run time; kept like any other (they come in few shapes: a run
    /// listing's filters).
    pub fn prepare(&self, sql: &str) -> Result<Statement<'c>> {
        self.prepare_cached(sql)
    }

    /// Runs a statement; the number of rows it changed.
    pub fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<usize> {
        self.prepare_cached(sql)?.execute(args)
    }

    /// Runs a write whose answer the caller does not need. On PostgreSQL it goes out with the
    /// next statement waited for (see [`PgConn`]); its error, if any, is that statement's.
    pub fn write(&self, sql: &str, args: &[Arg<'_>]) -> Result<()> {
        count_statement();
        match self {
            Connection::Sqlite(conn) => {
                conn.prepare_cached(sql)?.execute(rusqlite::params_from_iter(args))?;
            }
            Connection::Postgres(conn) => conn.defer(conn.statement(sql)?, args),
        }
        Ok(())
    }

    /// The first row of a query, mapped; an error when there is none (see [`OptionalExtension`]).
    pub fn query_row<T>(&self, sql: &str, args: &[Arg<'_>], f: impl FnOnce(&Row<'_>) -> Result<T>) -> Result<T> {
        self.prepare_cached(sql)?.query_row(args, f)
    }

    /// Runs `reads` in one read transaction on SQLite: one snapshot for all of them, and the
    /// connection's page cache kept from one to the next. A statement alone begins a transaction of
    /// its own, and one that finds the log moved on starts its cache over: a turn's read of a hundred
    /// steps while the writer commits read most pages again from the system. On PostgreSQL the
    /// reads run as they are, each its own snapshot, as before.
    pub fn snapshot<T>(&self, reads: impl FnOnce() -> Result<T>) -> Result<T> {
        let Connection::Sqlite(conn) = self else {
            return reads();
        };
        conn.execute_batch("BEGIN")?;
        match reads() {
            Ok(value) => {
                conn.execute_batch("COMMIT")?;
                Ok(value)
            }
            Err(error) => {
                // The connection goes back to the pool only after a read that succeeded.
                let _ = conn.execute_batch("ROLLBACK");
                Err(error)
            }
        }
    }
}

/// A prepared statement.
pub enum Statement<'c> {
    Sqlite(rusqlite::CachedStatement<'c>),
    Postgres {
        conn: &'c PgConn,
        statement: postgres::Statement,
    },
}

fn pg_args<'a>(args: &'a [Arg<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|arg| arg as &(dyn ToSql + Sync)).collect()
}

impl Statement<'_> {
    /// Runs it; the number of rows it changed.
    pub fn execute(&mut self, args: &[Arg<'_>]) -> Result<usize> {
        match self {
            Statement::Sqlite(statement) => Ok(statement.execute(rusqlite::params_from_iter(args))?),
            Statement::Postgres { conn, statement } => {
                let changed = conn.execute(statement, args)?;
                Ok(usize::try_from(changed).unwrap_or(usize::MAX))
            }
        }
    }

    /// The first row, mapped; an error when there is none (see [`OptionalExtension`]).
    pub fn query_row<T>(&mut self, args: &[Arg<'_>], f: impl FnOnce(&Row<'_>) -> Result<T>) -> Result<T> {
        match self {
            Statement::Sqlite(statement) => {
                let mut rows = statement.query(rusqlite::params_from_iter(args))?;
                match rows.next()? {
                    Some(row) => f(&Row::Sqlite(row)),
                    None => Err(Error::NoRows),
                }
            }
            Statement::Postgres { conn, statement } => {
                let rows = conn.query(statement, args)?;
                match rows.first() {
                    Some(row) => f(&Row::Postgres(row)),
                    None => Err(Error::NoRows),
                }
            }
        }
    }

    /// Every row, mapped, in order.
    pub fn query_map<T>(
        &mut self,
        args: &[Arg<'_>],
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let mut mapped = Vec::new();
        match self {
            Statement::Sqlite(statement) => {
                let mut rows = statement.query(rusqlite::params_from_iter(args))?;
                while let Some(row) = rows.next()? {
                    mapped.push(f(&Row::Sqlite(row)));
                }
            }
            Statement::Postgres { conn, statement } => {
                let rows = conn.query(statement, args)?;
                mapped.extend(rows.iter().map(|row| f(&Row::Postgres(row))));
            }
        }
        Ok(mapped.into_iter())
    }
}

/// `query_row(...).optional()`: no row is `None`, not an error.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(value) => Ok(Some(value)),
            Err(Error::NoRows) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Connection, OptionalExtension, PgConn, postgres_sql};

    /// A connection to `server` inside a transaction, with a table `t (k, v)`.
    fn table_t_in_a_transaction(server: &e2e::postgres::Postgres) -> PgConn {
        let conn = PgConn::connect(&server.url.parse().unwrap()).unwrap();
        conn.batch("CREATE TABLE t (k BIGINT PRIMARY KEY, v TEXT NOT NULL)")
            .unwrap();
        conn.batch("BEGIN").unwrap();
        conn
    }

    /// Deferred writes reach the server in the order written, before the statement that sends
    /// them; a failed one is that statement's error, and what it and the writes after it did is
    /// undone with the savepoint while the writes before it stand.
    #[test]
    fn deferred_writes_go_out_in_order_and_their_error_is_the_sending_statements() {
        let Some(server) = e2e::postgres::Postgres::database("store::sql::deferred_writes") else {
            return;
        };
        let conn = table_t_in_a_transaction(&server);
        let sql = Connection::postgres(&conn);
        sql.write("INSERT INTO t (k, v) VALUES (?1, ?2)", params![1, "a"])
            .unwrap();
        sql.write("UPDATE t SET v = ?2 WHERE k = ?1", params![1, "b"]).unwrap();
        let v: String = sql
            .query_row("SELECT v FROM t WHERE k = ?1", params![1], |row| row.get(0))
            .unwrap();
        assert_eq!(v, "b", "both writes went out, in order, before the read");

        conn.defer_batch("SAVEPOINT s");
        sql.write("INSERT INTO t (k, v) VALUES (?1, ?2)", params![2, "c"])
            .unwrap();
        sql.write("INSERT INTO t (k, v) VALUES (?1, ?2)", params![1, "again"])
            .unwrap();
        sql.write("INSERT INTO t (k, v) VALUES (?1, ?2)", params![3, "d"])
            .unwrap();
        let error = sql
            .query_row("SELECT COUNT(*) FROM t", params![], |row| row.get::<i64>(0))
            .unwrap_err();
        assert!(
            error.to_string().contains("23505"),
            "the duplicate's own error: {error}"
        );
        conn.batch("ROLLBACK TO SAVEPOINT s").unwrap();
        let count: i64 = sql
            .query_row("SELECT COUNT(*) FROM t", params![], |row| row.get(0))
            .unwrap();
        assert_eq!(count, 1, "the savepoint's writes are undone, the earlier ones stand");

        conn.begin_command(0);
        sql.write("INSERT INTO t (k, v) VALUES (?1, ?2)", params![4, "e"])
            .unwrap();
        conn.undo_command().unwrap();
        let four = sql
            .query_row("SELECT v FROM t WHERE k = ?1", params![4], |row| row.get::<String>(0))
            .optional()
            .unwrap();
        assert_eq!(four, None, "an undone command's writes never reach the server");
        conn.batch("COMMIT").unwrap();
    }

    /// A command ends without waiting for its writes. When one of them fails later, that command
    /// is undone with every command after it up to the one whose statement found the failure
    /// (they were applied on what it wrote), and that statement, and anything more of its
    /// command, is refused; the commands before it stand, and the commands begun after it go on.
    #[test]
    fn a_failed_write_of_an_ended_command_undoes_it_and_the_commands_after_it() {
        let Some(server) = e2e::postgres::Postgres::database("store::sql::ended_command") else {
            return;
        };
        let conn = table_t_in_a_transaction(&server);
        let sql = Connection::postgres(&conn);
        let insert = "INSERT INTO t (k, v) VALUES (?1, ?2)";
        let count = || sql.query_row("SELECT COUNT(*) FROM t", params![], |row| row.get::<i64>(0));
        conn.begin_command(0);
        sql.write(insert, params![1, "first"]).unwrap();
        conn.end_command();
        conn.begin_command(1);
        sql.write(insert, params![2, "second"]).unwrap();
        sql.write(insert, params![1, "duplicate"]).unwrap();
        sql.write(insert, params![3, "after the duplicate"]).unwrap();
        conn.end_command();
        conn.begin_command(2);
        sql.write(insert, params![4, "third"]).unwrap();
        conn.end_command();
        conn.begin_command(3);
        sql.write(insert, params![5, "fourth"]).unwrap();
        let error = count().unwrap_err().to_string();
        assert!(
            error.contains("undone with command 1") && error.contains("23505"),
            "the statement that found it names the command and its error: {error}"
        );
        let undone = conn.take_undone();
        assert_eq!(undone.len(), 1, "{undone:?}");
        assert_eq!(undone[0].0, 1, "commands 1 to 3 are undone");
        assert!(
            undone[0].1.contains("23505"),
            "the duplicate's own error: {}",
            undone[0].1
        );
        sql.write(insert, params![6, "more of the fourth"]).unwrap();
        assert!(count().is_err(), "nothing more of the undone command goes out");
        conn.end_command();
        conn.undo_command().unwrap();

        conn.begin_command(4);
        assert_eq!(count().unwrap(), 1, "only command 0 stands");
        sql.write(insert, params![5, "fifth"]).unwrap();
        conn.end_command();
        conn.begin_command(5);
        sql.write(insert, params![5, "sixth, a duplicate"]).unwrap();
        conn.end_command();
        conn.begin_command(6);
        sql.write(insert, params![7, "seventh"]).unwrap();
        conn.end_command();
        conn.flush().unwrap();
        let undone = conn.take_undone();
        assert_eq!(
            undone.iter().map(|f| f.0).collect::<Vec<_>>(),
            [5],
            "found by the flush: commands 5 and 6 are undone"
        );
        conn.batch("COMMIT").unwrap();
        let rows: Vec<(i64, String)> = sql
            .prepare("SELECT k, v FROM t ORDER BY k")
            .unwrap()
            .query_map(params![], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<super::Result<_>>()
            .unwrap();
        let expected = [(1, "first"), (5, "fifth")];
        assert_eq!(rows, expected.map(|(k, v)| (k, v.to_owned())));
    }

    #[test]
    fn parameters_are_numbered_for_postgresql_outside_literals() {
        assert_eq!(
            postgres_sql("SELECT a FROM t WHERE b = ?1 AND c = ?2"),
            "SELECT a FROM t WHERE b = $1 AND c = $2"
        );
        assert_eq!(
            postgres_sql("WHERE a = ? AND b = ? LIMIT ?"),
            "WHERE a = $1 AND b = $2 LIMIT $3"
        );
        assert_eq!(postgres_sql("VALUES (?1, ?2, ?2) -- x"), "VALUES ($1, $2, $2) -- x");
        assert_eq!(
            postgres_sql("WHERE s IN ('a?', 'b') AND k = ?1"),
            "WHERE s IN ('a?', 'b') AND k = $1"
        );
    }
}
