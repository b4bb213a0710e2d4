//! The HTTP surface: routes, state, and the OpenAPI document generated from the same
//! route definitions (utoipa-axum), so the document cannot drift from what is served.

pub mod error;
pub mod handlers;
pub mod middleware;
pub mod types;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::compression::predicate::{DefaultPredicate, Predicate as _, SizeAbove};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::SwaggerUi;

use crate::config::Config;
use crate::lease::LeaseService;
use crate::metrics::Metrics;
use error::ApiError;

/// Largest request body accepted: lock requests are a few small fields.
pub const BODY_LIMIT_BYTES: usize = 16 * 1024;

/// What every handler can reach. Cheap to clone: everything behind it is shared.
#[derive(Clone)]
pub struct AppState {
    pub service: Arc<LeaseService>,
    pub metrics: Arc<Metrics>,
    pub config: Arc<Config>,
    /// `redis` or `embedded`, as `/readyz` reports it.
    pub backend: &'static str,
    /// Fires when shutdown begins: `/readyz` fails from then on.
    pub shutdown: CancellationToken,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "redlockd",
        description = "Named locks with leases and fencing tokens, backed by the Redlock algorithm over N independent Redis masters.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "locks", description = "Grant, renew, revoke and inspect leases"),
        (name = "operations", description = "Health, readiness and metrics"),
    )
)]
struct ApiDoc;

/// The routes and the OpenAPI document that describes them.
pub fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(handlers::list))
        .routes(routes!(handlers::grant, handlers::inspect))
        .routes(routes!(handlers::renew, handlers::revoke, handlers::check))
        .routes(routes!(handlers::healthz))
        .routes(routes!(handlers::readyz))
        .routes(routes!(handlers::metrics))
        .split_for_parts()
}

/// The OpenAPI document as committed in `openapi/openapi.json`.
pub fn openapi_json() -> String {
    render(&routes().1)
}

fn render(doc: &utoipa::openapi::OpenApi) -> String {
    // Serialising a document built from static definitions cannot fail.
    doc.to_pretty_json().unwrap_or_default() + "\n"
}

async fn no_route() -> Response {
    ApiError::NoRoute.into_response()
}

async fn wrong_method() -> Response {
    ApiError::MethodNotAllowed.into_response()
}

/// Responses smaller than this are sent as they are: compressing a lease body costs more
/// than it saves. `/metrics`, `/openapi.json`, `/docs` and long lists are larger.
const COMPRESS_ABOVE_BYTES: u64 = 1024;

/// How much longer than the largest `wait_ms` a request may take before it is cut off.
const REQUEST_TIMEOUT_MARGIN: Duration = Duration::from_secs(10);

/// The whole application router.
pub fn router(state: AppState) -> Router {
    let (routes, doc) = routes();
    let doc_json: Arc<str> = render(&doc).into();
    let request_timeout = state.config.max_wait() + REQUEST_TIMEOUT_MARGIN;
    // The UI reads the document from `/openapi.json`, which serves the committed bytes;
    // every asset of the UI is in the binary (the `vendored` feature), none from the web.
    // The validator badge would fetch from validator.swagger.io: off.
    let docs = SwaggerUi::new("/docs")
        .config(utoipa_swagger_ui::Config::new(["/openapi.json"]).validator_url("none"));
    routes
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = doc_json.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        doc.to_string(),
                    )
                }
            }),
        )
        .merge(Router::from(docs))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        // Outermost first. `Router::layer` wraps each route after routing, so the log line
        // knows the matched route; it sits outside the timeout and the panic catcher so that
        // it logs their answers too.
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(
                    middleware::REQUEST_ID.clone(),
                    MakeRequestUuid,
                ))
                .layer(PropagateRequestIdLayer::new(middleware::REQUEST_ID.clone()))
                .layer(axum::middleware::from_fn(middleware::log_request))
                .layer(CatchPanicLayer::custom(middleware::panic_response))
                .layer(HandleErrorLayer::new(middleware::timed_out))
                .timeout(request_timeout)
                .layer(CompressionLayer::new().compress_when(
                    DefaultPredicate::new().and(SizeAbove::new(COMPRESS_ABOVE_BYTES)),
                )),
        )
        .with_state(state)
}
