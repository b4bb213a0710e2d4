//! What wraps every request: a request id (set or taken from `x-request-id`, echoed back),
//! one structured log line per request, a body that must arrive in time and within the
//! size limit, a timeout, and panics turned into the contract's 500 body.
//!
//! The log line names the matched route (`/locks/{name}/leases/{lease_id}`), never the raw
//! path: the raw path of renew, revoke and check carries the lease id, which is what
//! authorises those calls and must not reach a log.

use std::any::Any;
use std::time::Instant;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, Credentials, Outcome};
use crate::auth::{Auth, Need};
use crate::metrics::{Metrics, Op};
use crate::model::LockName;

pub(crate) static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Routes polled by probes and scrapers: logged at debug, not info, so that they do not
/// drown the lock traffic.
fn is_operations(route: &str) -> bool {
    matches!(route, "/healthz" | "/readyz" | "/metrics")
}

/// Where a request's handler leaves the name it parsed (`extract`), for the request's log
/// line and span: the name as the handler understood it, never a second reading of the
/// path (which may carry a lease id, and whose grammar is the router's).
#[derive(Debug, Clone, Default)]
pub(crate) struct Named(Arc<OnceLock<LockName>>);

impl Named {
    /// The first name parsed for the request is the one it is logged under.
    pub(crate) fn set(&self, name: &LockName) {
        let _ = self.0.set(name.clone());
    }

    fn get(&self) -> Option<&LockName> {
        self.0.get()
    }
}

/// The name of the token a request was made with, for its log line (never the token).
#[derive(Debug, Clone)]
pub(crate) struct CallerName(pub Arc<str>);

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Anyone: the probes.
    Open,
    /// Anyone, unless REDLOCKD_AUTH_PROTECT_OPERATIONS asks for a reader's token: metrics
    /// and the API's documents.
    Operations,
    /// A token whose role allows this.
    Token(Need),
}

/// What a metered route counts as in `redlockd_requests_total`: its op and the kind of
/// lock it is about (`lock`, `election`, `semaphore`, `session`), which the request's span
/// also carries.
pub(crate) type Metered = (Op, &'static str);

/// What the middleware knows of a route: what it counts as and who may call it, keyed by
/// method and matched path. Filled as the routes are registered (`http::registry`).
#[derive(Debug, Default)]
pub(crate) struct RouteTable(HashMap<Method, HashMap<String, (Option<Metered>, Access)>>);

impl RouteTable {
    pub(crate) fn insert(
        &mut self,
        method: Method,
        path: &str,
        op: Option<Metered>,
        access: Access,
    ) {
        let previous = self
            .0
            .entry(method)
            .or_default()
            .insert(path.to_owned(), (op, access));
        debug_assert!(previous.is_none(), "{path} registered twice");
    }

    fn get(&self, method: &Method, route: &str) -> Option<(Option<Metered>, Access)> {
        self.0.get(method)?.get(route).copied()
    }

    /// What a request on `route` counts as, if anything.
    fn metered(&self, method: &Method, route: Option<&str>) -> Option<Metered> {
        self.get(method, route?).and_then(|(metered, _)| metered)
    }

    /// What a route needs of its caller's token, or `None` when it is open. A route with
    /// no entry has no handler (the 404 and 405 fallbacks), so it reveals nothing.
    fn need(&self, method: &Method, route: Option<&str>, guard_operations: bool) -> Option<Need> {
        match self.get(method, route?)?.1 {
            Access::Open => None,
            Access::Operations => guard_operations.then_some(Need::Read),
            Access::Token(need) => Some(need),
        }
    }
}

/// With authentication on: the request's bearer token must be known (else 401) and its
/// role must allow the route (else 403). The caller goes into the request's extensions,
/// where the name extractors check its prefixes against the parsed name.
pub(crate) async fn authorize(
    State((auth, routes)): State<(Option<Arc<Auth>>, Arc<RouteTable>)>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(auth) = auth else {
        return next.run(request).await;
    };
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let Some(need) = routes.need(request.method(), route.as_deref(), auth.guard_operations) else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| {
            // Dapr's SDKs send their API token in a header of their own.
            let dapr = route.as_deref().is_some_and(|r| r.starts_with("/v1.0"));
            dapr.then(|| request.headers().get("dapr-api-token"))
                .flatten()
                .and_then(|v| v.to_str().ok())
        })
        .map(str::trim);
    // Flatcar's fleetlock client sends HTTP Basic: the token's name and the token.
    let basic = route
        .as_deref()
        .is_some_and(|r| r.starts_with("/fleetlock/"))
        .then(|| basic_credentials(request.headers()))
        .flatten();
    let presented = presented.or(basic.as_ref().map(|(_, token)| token.as_str()));
    let Some(presented) = presented.filter(|t| !t.is_empty()) else {
        return ApiError::Unauthorized(Credentials::Missing).into_response();
    };
    let Some(caller) = auth
        .tokens()
        .authenticate(presented)
        .filter(|c| basic.as_ref().is_none_or(|(user, _)| **user == *c.name))
    else {
        return ApiError::Unauthorized(Credentials::Unknown).into_response();
    };
    let name = CallerName(caller.name.clone());
    if !caller.allows(need) {
        let mut response = ApiError::Forbidden(format!(
            "the token {:?} ({}) may not do this",
            &*caller.name, caller.role
        ))
        .into_response();
        response.extensions_mut().insert(name);
        return response;
    }
    if let Some(wait) = auth.throttle(&caller) {
        let mut response = ApiError::TooMany {
            message: format!(
                "the token {:?} is over its request rate (REDLOCKD_AUTH_RATE)",
                &*caller.name
            ),
            retry_after: wait,
        }
        .into_response();
        response.extensions_mut().insert(name);
        return response;
    }
    request.extensions_mut().insert(caller);
    let mut response = next.run(request).await;
    response.extensions_mut().insert(name);
    response
}

/// The user and password of an `Authorization: Basic` header, if it has one.
fn basic_credentials(headers: &axum::http::HeaderMap) -> Option<(String, String)> {
    use base64::Engine as _;
    let encoded = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// One log line per request, and for lock routes the request's op, outcome and latency in
/// the metrics: timed once, here, from what the handler (or a rejection) left in the
/// response.
pub(crate) async fn log_request(
    State((metrics, routes)): State<(Arc<Metrics>, Arc<RouteTable>)>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    // Kept past the handler by cheap clones (a method, an `Arc`, shared bytes), not copies.
    let method = request.method().clone();
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map(MatchedPath::as_str);
    let named = Named::default();
    request.extensions_mut().insert(named.clone());
    let metered = routes.metered(&method, route);
    let request_id = request.headers().get(&REQUEST_ID).cloned();
    let request_id = request_id
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    // The request's span in a trace (a no-op unless traces are sent): the route and the
    // lock's name and kind, never the raw path (it may carry a lease id).
    let span = tracing::info_span!(
        target: crate::telemetry::TARGET,
        "request",
        otel.name = %format_args!("{method} {}", route.unwrap_or("<unmatched>")),
        otel.kind = "server",
        http.request.method = %method,
        http.route = route.unwrap_or("<unmatched>"),
        lock.name = tracing::field::Empty,
        lock.kind = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    crate::telemetry::follow_client(&span, request.headers());
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    let lock = named.get().map(LockName::as_str);
    if let Some(name) = lock {
        span.record("lock.name", name);
        span.record("lock.kind", metered.map_or("lock", |(_, kind)| kind));
    }
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    if response.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    let outcome = response.extensions().get::<Outcome>().map_or_else(
        || {
            if response.status().is_success() {
                "ok"
            } else {
                "error"
            }
        },
        |o| o.0,
    );
    let route = route.unwrap_or("<unmatched>");
    let caller = response
        .extensions()
        .get::<CallerName>()
        .map(|c| c.0.clone());
    let took = started.elapsed();
    if let Some((op, kind)) = metered {
        metrics.request(op, kind, outcome, took);
    }
    let latency_ms = took.as_secs_f64() * 1e3;
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                target: "redlockd::access",
                request_id = %request_id,
                method = %method,
                route,
                lock = lock.unwrap_or("-"),
                caller = caller.as_deref().unwrap_or("-"),
                status,
                latency_ms,
                outcome,
                "request"
            )
        };
    }
    if is_operations(route) {
        line!(debug);
    } else if status >= 500 {
        line!(warn);
    } else {
        line!(info);
    }
    response
}

/// Read the whole body before the handler runs, within the client timeout and the size
/// limit: a client that trickles its body is answered 408, never left to hold the request
/// (and a lock grant) open, and never told the masters were unavailable.
pub(crate) async fn read_body(
    axum::extract::State(timeout): axum::extract::State<std::time::Duration>,
    request: Request,
    next: Next,
) -> Response {
    use http_body_util::BodyExt as _;
    let (parts, body) = request.into_parts();
    let limited = http_body_util::Limited::new(body, super::BODY_LIMIT_BYTES);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => ApiError::RequestTimeout.into_response(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            ApiError::TooLarge.into_response()
        }
        Ok(Err(e)) => {
            ApiError::Invalid(format!("could not read the request body: {e}")).into_response()
        }
        Ok(Ok(collected)) => {
            let body = axum::body::Body::from(collected.to_bytes());
            next.run(Request::from_parts(parts, body)).await
        }
    }
}

/// A panic in a handler becomes the contract's 500 body; the panic is logged.
pub(crate) fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    tracing::error!(panic = message, "handler panicked");
    ApiError::Internal.into_response()
}

/// A request that outlived the request timeout.
pub(crate) async fn timed_out(_: tower::BoxError) -> Response {
    let mut response = ApiError::unavailable("the request timed out").into_response();
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    #[tokio::test]
    async fn a_panicking_handler_answers_500_with_the_error_body() {
        async fn boom() -> &'static str {
            panic!("deliberate")
        }
        let app = axum::Router::new()
            .route("/boom", axum::routing::get(boom))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(
                panic_response,
            ));
        let request = axum::http::Request::get("/boom")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "internal");
    }
}
