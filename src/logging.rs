//! The JSON log line: one object per event, written straight into the line buffer.
//!
//! tracing-subscriber's JSON formatter builds a map of every event's fields and serialises
//! it; with one access-log line per request that was about a fifth of redlockd's CPU in
//! the benchmark (docs/performance.md). This writes the same shape (`timestamp`, `level`,
//! the event's fields flattened, `target`) field by field, escaping as it goes. Spans are
//! not written: redlockd opens none.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats each event as one JSON object on one line.
pub(crate) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        write!(
            w,
            "{{\"timestamp\":\"{now}\",\"level\":\"{}\"",
            meta.level()
        )?;
        let mut fields = Fields {
            w: &mut w,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        w.write_str(",\"target\":")?;
        quoted(&mut w, meta.target())?;
        w.write_str("}\n")
    }
}

/// Writes each field as `,"name":value`.
struct Fields<'a, 'w> {
    w: &'a mut Writer<'w>,
    result: fmt::Result,
}

impl Fields<'_, '_> {
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        self.result = (|| {
            self.w.write_char(',')?;
            quoted(self.w, field.name())?;
            self.w.write_char(':')?;
            value(self.w)
        })();
    }
}

impl Visit for Fields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, |w| quoted(w, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |w| write!(w, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity.
        self.field(field, |w| {
            if value.is_finite() {
                write!(w, "{value}")
            } else {
                w.write_str("null")
            }
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |w| {
            w.write_char('"')?;
            write!(Escaped(w), "{value:?}")?;
            w.write_char('"')
        });
    }
}

fn quoted(w: &mut Writer<'_>, s: &str) -> fmt::Result {
    w.write_char('"')?;
    Escaped(w).write_str(s)?;
    w.write_char('"')
}

/// Escapes what passes through it for the inside of a JSON string.
struct Escaped<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, c) in s.char_indices() {
            let escape = match c {
                '"' => "\\\"",
                '\\' => "\\\\",
                '\n' => "\\n",
                '\r' => "\\r",
                '\t' => "\\t",
                c if (c as u32) < 0x20 => {
                    self.0.write_str(&s[start..i])?;
                    write!(self.0, "\\u{:04x}", c as u32)?;
                    start = i + c.len_utf8();
                    continue;
                }
                _ => continue,
            };
            self.0.write_str(&s[start..i])?;
            self.0.write_str(escape)?;
            start = i + c.len_utf8();
        }
        self.0.write_str(&s[start..])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_event_is_one_json_object_with_its_fields_flattened() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let shown = "a \"quoted\"\nline\u{1}";
            tracing::info!(
                target: "redlockd::access",
                request_id = %shown,
                status = 201u64,
                delta = -3i64,
                latency_ms = 0.25,
                nan = f64::NAN,
                ok = true,
                route = "/locks/{name}",
                "request"
            );
            tracing::warn!("second");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect(l))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let first = &lines[0];
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["target"], "redlockd::access");
        assert_eq!(first["message"], "request");
        assert_eq!(first["request_id"], "a \"quoted\"\nline\u{1}");
        assert_eq!(first["status"], 201);
        assert_eq!(first["delta"], -3);
        assert_eq!(first["latency_ms"], 0.25);
        assert!(first["nan"].is_null());
        assert_eq!(first["ok"], true);
        assert_eq!(first["route"], "/locks/{name}");
        assert!(chrono::DateTime::parse_from_rfc3339(first["timestamp"].as_str().unwrap()).is_ok());
        assert_eq!(lines[1]["level"], "WARN");
        assert_eq!(lines[1]["message"], "second");
    }
}
