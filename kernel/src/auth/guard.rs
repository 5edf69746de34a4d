//! The check in front of each guarded gRPC service.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tracing::debug;

use super::Keys;

/// A gRPC service behind the API-key check. With keys, a request passes only with a key that
/// holds the method's scope, and carries the [`Caller`](super::Caller) in its extensions; a
/// refused one is answered here and never reaches the service. Without keys it passes untouched.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    keys: Option<Arc<Keys>>,
}

impl<S> Guarded<S> {
    /// Puts `inner` behind `keys` (`None`: authentication is off).
    pub fn new(inner: S, keys: Option<Arc<Keys>>) -> Self {
        Guarded { inner, keys }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<Request<Body>> for Guarded<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Response<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        if let Some(keys) = &self.keys {
            let header = request.headers().get("authorization").map(|value| value.as_bytes());
            match keys.current().authorize(request.uri().path(), header) {
                Ok(caller) => {
                    request.extensions_mut().insert(caller);
                }
                Err(error) => {
                    debug!(path = request.uri().path(), %error, "request refused");
                    let response = Status::from(error).into_http();
                    return Box::pin(async move { Ok(response) });
                }
            }
        }
        let response = self.inner.call(request);
        Box::pin(async move { response.await.map(|response| response.map(Body::new)) })
    }
}
