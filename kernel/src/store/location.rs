//! Where the store lives, as `--db` names it: a SQLite file (a path, or `sqlite:PATH`) or a
//! PostgreSQL database (`postgres://` or `postgresql://`, the driver's connection URL).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The database `--db` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    /// One kernel per file, embedded.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by its connection URL.
    Postgres(String),
}

impl FromStr for Database {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the database is empty: give a file path or a postgres:// URL".into());
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            text.parse::<tokio_postgres::Config>()
                .map_err(|error| format!("invalid PostgreSQL URL: {error}"))?;
            return Ok(Database::Postgres(text.to_owned()));
        }
        if let Some((scheme, _)) = text.split_once("://") {
            return Err(format!(
                "unknown database scheme '{scheme}://': use a file path, sqlite:PATH or postgres://..."
            ));
        }
        let path = text.strip_prefix("sqlite:").unwrap_or(text);
        if path.is_empty() {
            return Err("sqlite: needs a file path after it".into());
        }
        Ok(Database::Sqlite(PathBuf::from(path)))
    }
}

impl fmt::Display for Database {
    /// The database as logs name it: a PostgreSQL URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

/// `postgres://user:secret@host/db?password=x` as `postgres://user:***@host/db?password=***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("password", _)) => "password=***".to_owned(),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_urls_name_their_backend() {
        assert_eq!("./kernel.db".parse(), Ok(Database::Sqlite("./kernel.db".into())));
        assert_eq!("sqlite:/var/k.db".parse(), Ok(Database::Sqlite("/var/k.db".into())));
        assert_eq!(
            "postgres://kernel@127.0.0.1:5432/kernel".parse(),
            Ok(Database::Postgres("postgres://kernel@127.0.0.1:5432/kernel".into()))
        );
        assert!(matches!("postgresql://h/db".parse(), Ok(Database::Postgres(_))));
        assert!(
            "mysql://h/db"
                .parse::<Database>()
                .unwrap_err()
                .contains("unknown database scheme 'mysql://'")
        );
        assert!("sqlite:".parse::<Database>().unwrap_err().contains("needs a file path"));
        assert!(
            "postgres://h:notaport/db"
                .parse::<Database>()
                .unwrap_err()
                .contains("invalid PostgreSQL URL")
        );
    }

    #[test]
    fn logs_never_show_a_password() {
        let db: Database = "postgres://kernel:s3cret@db:5432/k".parse().unwrap();
        assert_eq!(db.to_string(), "postgres://kernel:***@db:5432/k");
        let plain: Database = "postgres://kernel@db/k".parse().unwrap();
        assert_eq!(plain.to_string(), "postgres://kernel@db/k");
        let query: Database = "postgres://db/k?user=kernel&password=s3cret".parse().unwrap();
        assert_eq!(query.to_string(), "postgres://db/k?user=kernel&password=***");
    }
}
