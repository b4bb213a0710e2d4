//! Traces over OTLP, when `REDLOCKD_OTLP_ENDPOINT` or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set: a span per request (its route,
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

/// Where traces go, when anywhere: `REDLOCKD_OTLP_ENDPOINT`, or else the standard
/// OpenTelemetry variables.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Export<'a> {
    /// `REDLOCKD_OTLP_ENDPOINT`: a collector's base URL; spans go to `/v1/traces` as JSON.
    pub endpoint: Option<&'a str>,
    /// `REDLOCKD_CA_FILE`: CA certificates to trust for an `https://` collector, beside
    /// the system's store.
    pub ca_file: Option<&'a std::path::Path>,
}

/// The standard variables that name a collector without `REDLOCKD_OTLP_ENDPOINT`.
const STANDARD_ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

impl Export<'_> {
    /// Whether traces are wanted: a collector named by `REDLOCKD_OTLP_ENDPOINT` or a
    /// standard variable, unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
    fn wanted(&self, env: &dyn Fn(&str) -> Option<String>) -> bool {
        let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
        let off = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none");
        let named = self.endpoint.is_some_and(|e| !e.is_empty())
            || STANDARD_ENDPOINTS.iter().any(|k| set(k));
        named && !off
    }
}

/// The layer that sends [`TARGET`]'s spans to the collector `export` names, batched on a
/// thread of the exporter's own; `None` when no collector is named. With
/// `REDLOCKD_OTLP_ENDPOINT`, spans go to its `/v1/traces` as JSON; otherwise the standard
/// `OTEL_EXPORTER_OTLP_*` variables say where and how (endpoint, protocol `http/json` or
/// `http/protobuf`, headers, timeout), and `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`
/// name the service (`redlockd` by default).
pub(crate) fn otlp_layer<S>(
    export: Export<'_>,
) -> anyhow::Result<Option<(impl Layer<S> + use<S>, Traces)>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use anyhow::Context as _;
    use opentelemetry_otlp::WithHttpConfig as _;
    let env = |k: &str| std::env::var(k).ok();
    if !export.wanted(&env) {
        return Ok(None);
    }
    let roots = crate::trust::extra_roots(export.ca_file).context("REDLOCKD_CA_FILE")?;
    // reqwest's blocking client runs a runtime of its own, which may not be built inside
    // another: on a thread of its own, as the exporter does when it builds its own.
    let client = std::thread::spawn(move || crate::trust::blocking_client(&roots).build())
        .join()
        .map_err(|_| anyhow::anyhow!("building the trace exporter's HTTP client panicked"))??;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client);
    let protocol = [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .iter()
    .find_map(|k| env(k).map(|v| (*k, v)));
    if let Some((variable, value)) = &protocol
        && !matches!(value.trim(), "http/json" | "http/protobuf")
    {
        anyhow::bail!(
            "{variable}={value}: redlockd sends OTLP over HTTP: http/json or http/protobuf"
        );
    }
    let protocol_named = protocol.is_some();
    match export.endpoint.filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            builder = builder
                .with_protocol(Protocol::HttpJson)
                .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
        }
        None if !protocol_named => builder = builder.with_protocol(Protocol::HttpJson),
        None => {}
    }
    let exporter = builder.build()?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none_or(|v| v.trim().is_empty()) {
        resource = resource.with_service_name("redlockd");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("redlockd");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
    Ok(Some((layer, Traces(provider))))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(endpoint: Option<&str>, vars: &[(&str, &str)]) -> bool {
        let env = |k: &str| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        };
        Export {
            endpoint,
            ca_file: None,
        }
        .wanted(&env)
    }

    #[test]
    fn traces_are_sent_when_a_collector_is_named_by_ours_or_the_standard_variables() {
        assert!(!wanted(None, &[]));
        assert!(!wanted(Some(""), &[]));
        assert!(wanted(Some("http://collector:4318"), &[]));
        assert!(wanted(
            None,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]
        ));
        assert!(wanted(
            None,
            &[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://c:4318/v1/traces"
            )]
        ));
        assert!(!wanted(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]));
        // The SDK's own off switches win over any endpoint.
        assert!(!wanted(
            Some("http://collector:4318"),
            &[("OTEL_SDK_DISABLED", "true")]
        ));
        assert!(!wanted(
            None,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_EXPORTER", "none")
            ]
        ));
    }
}
