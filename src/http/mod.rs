//! The HTTP surface: routes, state, and the OpenAPI document generated from the same
//! route definitions (utoipa-axum), so the document cannot drift from what is served.

mod dapr;
mod elections;
mod error;
mod extract;
mod fleetlock;
mod handlers;
mod kinds;
mod middleware;
mod schema;
pub(crate) mod serve;
mod sessions;
mod stream;
pub(crate) mod tls;
mod types;

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

use crate::auth::Need;
use crate::config::Settings;
use crate::lease::LeaseService;
use crate::metrics::{Metrics, Op};
use error::ApiError;
use middleware::{Access, Metered, RouteTable};
use utoipa_axum::router::UtoipaMethodRouter;

/// Routes being registered with what the middleware needs to know of each: the router,
/// its document and the table.
struct Registry {
    api: OpenApiRouter<AppState>,
    table: RouteTable,
}

impl Registry {
    fn new() -> Self {
        Self {
            api: OpenApiRouter::with_openapi(ApiDoc::openapi()),
            table: RouteTable::default(),
        }
    }

    /// A route about a `kind` of lock: counted as `op`, allowed by `access`.
    fn add(self, route: UtoipaMethodRouter<AppState>, (op, kind): Metered, access: Access) -> Self {
        self.register(route, Some((op, kind)), access)
    }

    /// A route outside the request metrics (probes, scrapes).
    fn unmetered(self, route: UtoipaMethodRouter<AppState>, access: Access) -> Self {
        self.register(route, None, access)
    }

    fn register(
        mut self,
        route: UtoipaMethodRouter<AppState>,
        op: Option<Metered>,
        access: Access,
    ) -> Self {
        for (path, item) in route.1.paths.iter() {
            use axum::http::Method;
            let methods = [
                (Method::GET, item.get.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::DELETE, item.delete.is_some()),
                (Method::PATCH, item.patch.is_some()),
                (Method::HEAD, item.head.is_some()),
                (Method::OPTIONS, item.options.is_some()),
                (Method::TRACE, item.trace.is_some()),
            ];
            for (method, present) in methods {
                if present {
                    self.table.insert(method, path, op, access);
                }
            }
        }
        self.api = self.api.routes(route);
        self
    }

    fn finish(self) -> (Router<AppState>, utoipa::openapi::OpenApi, RouteTable) {
        let (router, doc) = self.api.split_for_parts();
        (router, doc, self.table)
    }
}

/// Largest request body accepted: lock requests are a few small fields.
pub(crate) const BODY_LIMIT_BYTES: usize = 16 * 1024;

/// What every handler can reach. Cheap to clone: everything behind it is shared.
#[derive(Clone)]
pub(crate) struct AppState {
    pub service: Arc<LeaseService>,
    pub metrics: Arc<Metrics>,
    pub settings: Arc<Settings>,
    /// Fires when shutdown begins: `/readyz` fails from then on.
    pub shutdown: CancellationToken,
    /// The bearer tokens, when authentication is on.
    pub auth: Option<Arc<crate::auth::Auth>>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "redlockd",
        description = "Named locks with leases and fencing tokens, backed by the Redlock algorithm over N independent Redis masters.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(crate::wire::QueuedEvent, crate::wire::LostEvent)),
    tags(
        (name = "locks", description = "Grant, renew, revoke and inspect leases"),
        (name = "elections", description = "Leader election: campaign, observe, proclaim, resign"),
        (name = "semaphores", description = "At most `limit` holders: take, renew, release and inspect permits"),
        (name = "sessions", description = "One heartbeat for many holds: open, renew, read and end a session"),
        (name = "operations", description = "Health, readiness and metrics"),
        (name = "dapr", description = "Dapr's distributed lock API (v1.0-alpha1), for Dapr's SDKs"),
        (name = "fleetlock", description = "FleetLock: reboot slots for Zincati and Flatcar's fleetlock client"),
    )
)]
struct ApiDoc;

/// Each route with what it is besides its handler: the op it counts as in
/// `redlockd_requests_total` and what it needs of a bearer token. A handler is registered
/// only with them, so a new route cannot be left open by forgetting to list it. Each kind
/// of `kinds` registers its own routes (`kind_routes!` writes them).
fn registry() -> Registry {
    use Access::{Open, Operations, Token};
    use Need::{Admin, Hold, Read};
    let registry = [
        kinds::locks::register,
        kinds::elections::register,
        kinds::semaphores::register,
    ]
    .into_iter()
    .fold(Registry::new(), |registry, kind| kind(registry));
    registry
        .add(routes!(handlers::check), (Op::Check, "lock"), Token(Hold))
        .add(
            routes!(handlers::check_permit),
            (Op::Check, "semaphore"),
            Token(Hold),
        )
        .add(routes!(handlers::list), (Op::List, "lock"), Token(Read))
        .add(
            routes!(handlers::grant_many),
            (Op::Grant, "lock"),
            Token(Hold),
        )
        .add(
            routes!(elections::observe),
            (Op::Observe, "election"),
            Token(Read),
        )
        .add(routes!(sessions::open), (Op::Grant, "session"), Token(Hold))
        .add(
            routes!(sessions::renew),
            (Op::Renew, "session"),
            Token(Hold),
        )
        .add(routes!(sessions::end), (Op::Revoke, "session"), Token(Hold))
        .add(
            routes!(sessions::resume),
            (Op::Renew, "session"),
            Token(Hold),
        )
        .add(routes!(sessions::read), (Op::Check, "session"), Token(Hold))
        .add(routes!(dapr::lock), (Op::Grant, "lock"), Token(Hold))
        .add(routes!(dapr::unlock), (Op::Revoke, "lock"), Token(Hold))
        .add(
            routes!(fleetlock::pre_reboot),
            (Op::Grant, "semaphore"),
            Token(Hold),
        )
        .add(
            routes!(fleetlock::steady_state),
            (Op::Revoke, "semaphore"),
            Token(Hold),
        )
        .add(
            routes!(fleetlock::release_node),
            (Op::ForceRelease, "semaphore"),
            Token(Admin),
        )
        .unmetered(routes!(dapr::metadata), Open)
        .unmetered(routes!(dapr::healthz), Open)
        .unmetered(routes!(dapr::outbound), Open)
        .unmetered(routes!(handlers::healthz), Open)
        .unmetered(routes!(handlers::readyz), Open)
        .unmetered(routes!(handlers::metrics), Operations)
}

/// The routes and the OpenAPI document that describes them.
pub(crate) fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, doc, _) = registry().finish();
    (router, doc)
}

/// The OpenAPI document as committed in `openapi/openapi.json` and served at
/// `/openapi.json`.
pub fn openapi_json() -> String {
    render(&routes().1)
}

fn render(doc: &utoipa::openapi::OpenApi) -> String {
    // Serialising a document built from static definitions cannot fail. Through a `Value`,
    // so that keys are written in a stable (sorted) order.
    let value = serde_json::to_value(doc).unwrap_or_default();
    serde_json::to_string_pretty(&value).unwrap_or_default() + "\n"
}

async fn no_route() -> Response {
    ApiError::NoRoute.into_response()
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::MethodNotAllowed(method_hint(&method, uri.path())).into_response()
}

/// What a request answered 405 most likely meant, where the mistake is a common one: a
/// session is held as other holds are by their `/hold` routes, but a session has none (a
/// held session is a `POST /sessions` with `Accept: text/event-stream`).
fn method_hint(method: &axum::http::Method, path: &str) -> Option<&'static str> {
    let session = path.strip_prefix("/sessions/")?;
    (method == axum::http::Method::POST && !session.contains('/')).then_some(
        "a session is opened with POST /sessions, and held while connected with `Accept: text/event-stream` on that call; POST /sessions/{session_id}/hold resumes a session's held stream",
    )
}

/// Responses smaller than this are sent as they are: compressing a lease body costs more
/// than it saves. `/metrics`, `/openapi.json`, `/docs` and long lists are larger.
const COMPRESS_ABOVE_BYTES: u64 = 1024;

/// How much longer than the largest `wait_ms` a request may take before it is cut off.
const REQUEST_TIMEOUT_MARGIN: Duration = Duration::from_secs(10);

/// The interactive documentation at `/docs` and `/docs/` alike (a redirect from one to the
/// other would leave `curl localhost:8080/docs` printing nothing). The UI reads the
/// document from `/openapi.json`, which serves the committed bytes; every asset of the UI is
/// in the binary (the `vendored` feature), none from the web. The validator badge would
/// fetch from validator.swagger.io: off.
fn docs() -> Router<AppState> {
    use axum::extract::Path;
    use axum::routing::get;
    let config = Arc::new(utoipa_swagger_ui::Config::new(["/openapi.json"]).validator_url("none"));
    let index = {
        let config = config.clone();
        move || std::future::ready(docs_file("", config.clone()))
    };
    Router::new()
        .route("/docs", get(index.clone()))
        .route("/docs/", get(index))
        .route(
            "/docs/{*file}",
            get(move |Path(file): Path<String>| {
                std::future::ready(docs_file(&file, config.clone()))
            }),
        )
}

/// The documentation site (docs/, built by `mdbook build`) at `/book/`, from the folder
/// `REDLOCKD_BOOK_DIR` names: tower-http's `ServeDir` serves it (content types, no path
/// outside the folder, `index.html` for a folder). Without the setting the routes answer
/// 404 saying how to get the site. `/book` redirects to `/book/`, where the pages' relative
/// links resolve.
fn book(dir: Option<std::path::PathBuf>) -> Router<AppState> {
    use axum::extract::Path;
    use axum::routing::get;
    use tower::ServiceExt as _;
    let serve = move |file: String| {
        let dir = dir.clone();
        async move {
            let Some(dir) = dir else {
                return ApiError::NotServed(
                    "this replica serves no docs site: build it with `mdbook build` (into \
                     target/book) and set REDLOCKD_BOOK_DIR to that folder",
                )
                .into_response();
            };
            let request = match axum::http::Request::get(format!("/{file}"))
                .body(axum::body::Body::empty())
            {
                Ok(request) => request,
                Err(_) => return ApiError::NoRoute.into_response(),
            };
            match tower_http::services::ServeDir::new(dir)
                .oneshot(request)
                .await
            {
                Ok(found) if found.status().is_success() => found.into_response(),
                _ => ApiError::NoRoute.into_response(),
            }
        }
    };
    let index = serve.clone();
    Router::new()
        .route(
            "/book",
            get(|| async { axum::response::Redirect::permanent("/book/") }),
        )
        .route("/book/", get(move || index(String::new())))
        .route(
            "/book/{*file}",
            get(move |Path(file): Path<String>| serve(file)),
        )
}

/// One file of the documentation UI. The page's assets are named relative to `/docs/`; a
/// `<base>` makes them resolve there when the page is fetched as `/docs`.
fn docs_file(file: &str, config: Arc<utoipa_swagger_ui::Config<'static>>) -> Response {
    match utoipa_swagger_ui::serve(file, config) {
        Ok(Some(found)) => {
            let mut bytes = found.bytes.into_owned();
            if file.is_empty() || file == "index.html" {
                let page = String::from_utf8_lossy(&bytes).replacen(
                    "<head>",
                    "<head>\n  <base href=\"/docs/\">",
                    1,
                );
                bytes = page.into_bytes();
            }
            let mut response =
                ([(header::CONTENT_TYPE, found.content_type)], bytes).into_response();
            if found.gzpipped {
                response.headers_mut().insert(
                    header::CONTENT_ENCODING,
                    axum::http::HeaderValue::from_static("gzip"),
                );
            }
            response
        }
        Ok(None) => ApiError::NoRoute.into_response(),
        Err(e) => {
            tracing::error!(error = %e, "documentation file {file} could not be served");
            ApiError::Internal.into_response()
        }
    }
}

/// The whole application router.
pub(crate) fn router(state: AppState) -> Router {
    let (routes, doc, mut table) = registry().finish();
    // Served beside the registered routes: the document and its UI.
    for path in [
        "/openapi.json",
        "/docs",
        "/docs/",
        "/docs/{*file}",
        "/book",
        "/book/",
        "/book/{*file}",
    ] {
        table.insert(axum::http::Method::GET, path, None, Access::Operations);
    }
    let table = Arc::new(table);
    let doc_json: Arc<str> = render(&doc).into();
    let request_timeout = state.settings.leases.max_wait + REQUEST_TIMEOUT_MARGIN;
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
        .merge(docs())
        .merge(book(state.settings.book_dir.clone()))
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
                .layer(axum::middleware::from_fn_with_state(
                    (state.metrics.clone(), table.clone()),
                    middleware::log_request,
                ))
                .layer(axum::middleware::from_fn_with_state(
                    (state.auth.clone(), table),
                    middleware::authorize,
                ))
                .layer(CatchPanicLayer::custom(middleware::panic_response))
                .layer(HandleErrorLayer::new(middleware::timed_out))
                .timeout(request_timeout)
                .layer(axum::middleware::from_fn_with_state(
                    state.settings.client_timeout,
                    middleware::read_body,
                ))
                .layer(CompressionLayer::new().compress_when(
                    DefaultPredicate::new().and(SizeAbove::new(COMPRESS_ABOVE_BYTES)),
                )),
        )
        .with_state(state)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_states_the_constraints_the_service_enforces() {
        let doc: serde_json::Value = serde_json::from_str(&super::openapi_json()).unwrap();
        let grant = &doc["paths"]["/locks/{name}"]["post"];
        let name = &grant["parameters"][0];
        assert_eq!(name["name"], "name");
        assert_eq!(name["schema"]["pattern"], "^[A-Za-z0-9._:~-]{1,256}$");
        // An absent body (not required) or `null`, which the parser takes as no fields.
        assert_ne!(grant["requestBody"]["required"], true);
        let body = &grant["requestBody"]["content"]["application/json"]["schema"]["oneOf"];
        assert_eq!(body[1]["type"], "null", "{body}");
        let list = doc["paths"]["/locks"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let limit = list.iter().find(|p| p["name"] == "limit").unwrap();
        assert_eq!(
            (
                limit["schema"]["minimum"].as_u64(),
                limit["schema"]["maximum"].as_u64()
            ),
            (Some(1), Some(1000))
        );
        let lease = &doc["paths"]["/locks/{name}/leases/{lease_id}"]["put"]["parameters"][1];
        assert_eq!(lease["schema"]["maxLength"], 64);
    }

    /// The bodies' fields state their bounds as literals (utoipa's attributes take no
    /// constant): they must be the parsers' bounds.
    #[test]
    fn the_bodies_bounds_are_the_parsers() {
        use crate::model::{DEFAULT_MAX_TTL_MS, DEFAULT_MAX_WAIT_MS, MIN_TTL_MS};
        let doc: serde_json::Value = serde_json::from_str(&super::openapi_json()).unwrap();
        let mut seen = 0;
        for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
            for (field, min, max) in [
                ("ttl_ms", MIN_TTL_MS, DEFAULT_MAX_TTL_MS),
                ("wait_ms", 0, DEFAULT_MAX_WAIT_MS),
            ] {
                let property = &schema["properties"][field];
                if property.is_object() {
                    seen += 1;
                    assert_eq!(
                        (property["minimum"].as_u64(), property["maximum"].as_u64()),
                        (Some(min), Some(max)),
                        "{name}.{field}"
                    );
                }
            }
        }
        assert!(seen >= 8, "{seen} bounded fields");
    }
}
