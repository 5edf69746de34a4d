//! The SQL the store's operations speak, in the shape of rusqlite's API (`prepare_cached`,
//! `execute`, `query_row`, `query_map`, `optional`, `params!`, `row.get`), so the operations are
//! written once for every backend: statements with `?N` parameters, arguments as [`Arg`]s, and
//! rows read by index into the kernel's types through [`FromCell`].
//!
//! SQLite is the only backend behind it in this release; PostgreSQL comes next (rewriting `?N`
//! to `$N` and binding each [`Arg`] to the parameter's type).

use std::fmt;

/// What a statement failed with.
#[derive(Debug)]
pub enum Error {
    /// A query that expected a row got none ([`OptionalExtension::optional`] makes it `None`).
    NoRows,
    /// The backend's own message.
    Backend(String),
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
            Error::Backend(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        match error {
            rusqlite::Error::QueryReturnedNoRows => Error::NoRows,
            other => Error::Backend(other.to_string()),
        }
    }
}

impl From<Error> for crate::error::KernelError {
    fn from(error: Error) -> Self {
        crate::error::KernelError::Store(error.to_string())
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

/// Arguments for a statement, each borrowed: `params![run.as_str(), step.attempts]`.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        &[$($crate::store::sql::ToArg::to_arg(&$value)),*][..]
    };
}
pub(crate) use params;

/// A column value the kernel reads.
pub trait FromCell: Sized {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self>;
}

impl<T: rusqlite::types::FromSql> FromCell for T {
    fn from_sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
        row.get(index)
    }
}

/// One row of a result.
pub struct Row<'r> {
    inner: &'r rusqlite::Row<'r>,
}

impl Row<'_> {
    /// Column `index` as `T`.
    pub fn get<T: FromCell>(&self, index: usize) -> Result<T> {
        Ok(T::from_sqlite(self.inner, index)?)
    }
}

/// A connection the operations run on.
#[derive(Clone, Copy)]
pub struct Connection<'c> {
    sqlite: &'c rusqlite::Connection,
}

impl<'c> Connection<'c> {
    /// The operations' view of a SQLite connection.
    pub fn sqlite(conn: &'c rusqlite::Connection) -> Self {
        Connection { sqlite: conn }
    }

    /// A statement, prepared once per connection and kept.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'c>> {
        Ok(Statement {
            inner: self.sqlite.prepare_cached(sql)?,
        })
    }

    /// A statement built at run time (not kept).
    pub fn prepare(&self, sql: &str) -> Result<Statement<'c>> {
        self.prepare_cached(sql)
    }

    /// Runs a statement; the number of rows it changed.
    pub fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<usize> {
        self.prepare_cached(sql)?.execute(args)
    }

    /// The first row of a query, mapped; an error when there is none (see [`OptionalExtension`]).
    pub fn query_row<T>(&self, sql: &str, args: &[Arg<'_>], f: impl FnOnce(&Row<'_>) -> Result<T>) -> Result<T> {
        self.prepare_cached(sql)?.query_row(args, f)
    }
}

/// A prepared statement.
pub struct Statement<'c> {
    inner: rusqlite::CachedStatement<'c>,
}

impl Statement<'_> {
    /// Runs it; the number of rows it changed.
    pub fn execute(&mut self, args: &[Arg<'_>]) -> Result<usize> {
        Ok(self.inner.execute(rusqlite::params_from_iter(args))?)
    }

    /// The first row, mapped; an error when there is none (see [`OptionalExtension`]).
    pub fn query_row<T>(&mut self, args: &[Arg<'_>], f: impl FnOnce(&Row<'_>) -> Result<T>) -> Result<T> {
        let mut rows = self.inner.query(rusqlite::params_from_iter(args))?;
        match rows.next()? {
            Some(row) => f(&Row { inner: row }),
            None => Err(Error::NoRows),
        }
    }

    /// Every row, mapped, in order.
    pub fn query_map<T>(
        &mut self,
        args: &[Arg<'_>],
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let mut rows = self.inner.query(rusqlite::params_from_iter(args))?;
        let mut mapped = Vec::new();
        while let Some(row) = rows.next()? {
            mapped.push(f(&Row { inner: row }));
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
