//! API keys: the `authorization: Bearer <key>` metadata both clients send on every call.

use tonic::metadata::{Ascii, MetadataValue};

/// A key, ready to travel as metadata; its `Debug` never shows the secret.
#[derive(Clone)]
pub(crate) struct ApiKey(MetadataValue<Ascii>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    /// Checks that `secret` can travel as metadata (visible ASCII, no spaces).
    pub(crate) fn new(secret: &str) -> Result<Self, String> {
        let secret = secret.trim();
        if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the API key must be non-empty visible ASCII without spaces".to_owned());
        }
        let mut value: MetadataValue<Ascii> = format!("Bearer {secret}")
            .parse()
            .map_err(|_| "the API key cannot travel as metadata".to_owned())?;
        value.set_sensitive(true);
        Ok(ApiKey(value))
    }
}

/// `message` as a request carrying `key`, when there is one.
pub(crate) fn request<T>(message: T, key: Option<&ApiKey>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(ApiKey(value)) = key {
        request.metadata_mut().insert("authorization", value.clone());
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_travel_as_bearer_metadata() {
        let key = ApiKey::new(" kk_abc123 ").unwrap();
        let request = request((), Some(&key));
        assert_eq!(request.metadata().get("authorization").unwrap(), "Bearer kk_abc123");
        assert!(!format!("{key:?}").contains("abc"));
        assert!(request.metadata().get("authorization").unwrap().is_sensitive());
        assert!(super::request((), None).metadata().get("authorization").is_none());
        for bad in ["", "a b", "é"] {
            assert!(ApiKey::new(bad).is_err(), "{bad:?}");
        }
    }
}
