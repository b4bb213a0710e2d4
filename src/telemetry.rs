//! Traces over OTLP, when `REDLOCKD_OTLP_ENDPOINT` is set: a span per request (its route,
//! the lock's name and kind, never a lease id) with one child span per master step, so that
//! a slow grant can be followed to the master that made it slow. A client's W3C
//! `traceparent` makes the request's span a child of the client's.
//!
//! The spans have a target of their own, [`TARGET`], that only the OTLP layer listens to:
//! with no endpoint nothing listens, and creating one of these spans costs a cached
//! "disabled" check, nothing more. The log lines do not change either way.

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;

/// The target of every span meant for traces, and of nothing else.
pub(crate) const TARGET: &str = "redlockd::trace";

/// The exporter's provider: dropping it without `shutdown` loses the spans not yet sent.
pub(crate) struct Traces(SdkTracerProvider);

impl Traces {
    /// Send the spans still buffered, and stop.
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            eprintln!("redlockd: traces not all sent at exit: {e}");
        }
    }
}

/// The layer that sends [`TARGET`]'s spans to the OTLP/HTTP collector at `endpoint`
/// (`http://collector:4318`; traces go to `/v1/traces`, as JSON), batched on a thread of
/// the exporter's own.
pub(crate) fn otlp_layer<S>(endpoint: &str) -> anyhow::Result<(impl Layer<S> + use<S>, Traces)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let endpoint = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(endpoint)
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("redlockd")
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("redlockd");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
    Ok((layer, Traces(provider)))
}

/// Make `span` a child of the trace a client named in its `traceparent` header, if any.
pub(crate) fn follow_client(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if span.is_disabled() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    let _ = span.set_parent(parent);
}

/// A request's headers, as the W3C propagator reads them.
struct Headers<'a>(&'a axum::http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}
