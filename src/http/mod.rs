//! The HTTP surface: routes, state, and the OpenAPI document generated from the same
//! route definitions (utoipa-axum), so the document cannot drift from what is served.

pub mod error;
pub mod handlers;
pub mod types;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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
    let (_, doc) = routes();
    // Serialising a document built from static definitions cannot fail.
    doc.to_pretty_json().unwrap_or_default() + "\n"
}

async fn no_route() -> Response {
    ApiError::NoRoute.into_response()
}

async fn wrong_method() -> Response {
    ApiError::MethodNotAllowed.into_response()
}

/// The whole application router.
pub fn router(state: AppState) -> Router {
    let (routes, doc) = routes();
    let doc_json = Arc::new(openapi_json());
    drop(doc);
    routes
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = doc_json.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        doc.to_string(),
                    )
                }
            }),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .with_state(state)
}
