//! The OpenAPI document against the router, operation by operation: every parameter is
//! sent values its schema allows and values it refuses, and a bad body, and each answer
//! must be one the operation documents, refused with 400 exactly when the schema refuses
//! the value; bodies of every JSON type likewise, by the body's schema. What a generated client or a fuzzer reads is then what the server does.

use crate::common;

use common::TestApp;
use serde_json::{Value, json};

/// Does `schema` (the keywords the document uses for parameters) allow `value`?
fn allows(schema: &Value, value: &str) -> bool {
    match schema["type"].as_str() {
        Some("boolean") => value == "true" || value == "false",
        Some("integer") => {
            let Ok(n) = value.parse::<i64>() else {
                return false;
            };
            let min = schema["minimum"].as_i64();
            let max = schema["maximum"].as_i64();
            let unsigned = schema["format"] == "int64" && schema["minimum"].is_null();
            !(min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) || (unsigned && n < 0))
                && (schema["minimum"].is_number() || n >= 0)
        }
        _ => {
            let len = value.len() as u64;
            let short = schema["minLength"].as_u64().is_some_and(|m| len < m);
            let long = schema["maxLength"].as_u64().is_some_and(|m| len > m);
            let pattern = schema["pattern"].as_str().is_none_or(|p| {
                regex::Regex::new(p)
                    .expect("a valid pattern")
                    .is_match(value)
            });
            !short && !long && pattern
        }
    }
}

/// Values to try for a parameter of `schema`: around its bounds, and malformed.
fn candidates(name: &str, schema: &Value) -> Vec<String> {
    if schema["type"] == "boolean" {
        return ["true", "false", "", "yes", "1"].map(str::to_owned).into();
    }
    if schema["type"] == "integer" {
        let mut v: Vec<String> = ["-1", "0", "1", "abc", "99", "100", "5000", "60000", "60001"]
            .map(str::to_owned)
            .into();
        for bound in ["minimum", "maximum"] {
            if let Some(b) = schema[bound].as_i64() {
                v.extend([b - 1, b, b + 1].map(|n| n.to_string()));
            }
        }
        v.extend(["3600000", "3600001"].map(str::to_owned));
        return v;
    }
    let long = |n: usize| "x".repeat(n);
    let mut v = vec![
        String::new(),
        "ok-1".into(),
        "a b".into(),
        "a*".into(),
        "é".into(),
        "AAAAAAAAAAAAAAAAAAAAAA".into(),
        long(64),
        long(65),
        long(255),
        long(256),
        long(257),
    ];
    if name == "Idempotency-Key" {
        v.push("tab\there".into());
    }
    v
}

/// A value every parameter of its kind accepts, for the parameters not under test.
fn good(name: &str) -> &'static str {
    match name {
        "lease_id" => "AAAAAAAAAAAAAAAAAAAAAA",
        "ttl_ms" => "5000",
        "wait_ms" | "after" | "prefix" | "lock_delay_ms" | "session" | "grace_ms" | "kept" => "",
        "limit" => "10",
        "fencing_token" => "42",
        _ => "ok-1",
    }
}

fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The example of an operation's body when the body is required (the parameters are
/// tried with a body the call accepts, so that a 400 is theirs).
fn required_body(doc: &Value, op: &Value) -> Option<Value> {
    if op["requestBody"]["required"] != true {
        return None;
    }
    let schema = &op["requestBody"]["content"]["application/json"]["schema"]["$ref"];
    let name = schema.as_str()?.strip_prefix("#/components/schemas/")?;
    Some(doc["components"]["schemas"][name]["example"].clone())
}

/// A validator of an operation's JSON body, by the schema the document gives it, with the
/// whole document as its root so that its references resolve.
fn body_schema(doc: &Value, op: &Value) -> jsonschema::Validator {
    let schema = &op["requestBody"]["content"]["application/json"]["schema"];
    let mut root = doc.clone();
    for (keyword, value) in schema.as_object().expect("a body's schema") {
        root[keyword] = value.clone();
    }
    let validator = jsonschema::validator_for(&root).expect("the document's schemas compile");
    // The check that the check can fail: no body is a list.
    assert!(!validator.is_valid(&json!([])), "{schema} allows anything");
    validator
}

#[tokio::test]
async fn every_answer_is_documented_and_400_exactly_when_the_schema_refuses() {
    let app = TestApp::embedded().await;
    let doc: Value = serde_json::from_str(&app.text("/openapi.json").await).unwrap();
    let mut wrong = Vec::new();
    let mut sent = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let documented = |status: u16| op["responses"][status.to_string()].is_object();
            let body = required_body(&doc, op);
            for (i, param) in params.iter().enumerate() {
                let name = param["name"].as_str().unwrap();
                for value in candidates(name, &param["schema"]) {
                    // An empty path segment names another route (or none).
                    if value.is_empty() && param["in"] == "path" {
                        continue;
                    }
                    let mut uri = path.clone();
                    let mut query = Vec::new();
                    let mut headers = Vec::new();
                    for (j, p) in params.iter().enumerate() {
                        let n = p["name"].as_str().unwrap();
                        // Each request its own name, so that no grant waits behind another.
                        let fresh = format!("c-{sent}");
                        let v = match (i == j, n) {
                            (true, _) => value.as_str(),
                            (false, "name" | "names") => fresh.as_str(),
                            // A kept hold's length is the server's: no ttl_ms beside it.
                            (false, "ttl_ms") if name == "kept" => "",
                            (false, n) => good(n),
                        };
                        match p["in"].as_str().unwrap() {
                            "path" => uri = uri.replace(&format!("{{{n}}}"), &encode(v)),
                            "query" if i == j || !v.is_empty() => {
                                query.push(format!("{n}={}", encode(v)))
                            }
                            "header" if i == j => headers.push((n.to_owned(), v.to_owned())),
                            _ => {}
                        }
                    }
                    if !query.is_empty() {
                        uri = format!("{uri}?{}", query.join("&"));
                    }
                    let mut call = app.call(&method.to_uppercase(), &uri);
                    if let Some(body) = &body {
                        call = call.json(body);
                    }
                    for (n, v) in &headers {
                        call = call.header(n, v);
                    }
                    let answer = if path.ends_with("/observe") || path.ends_with("/hold") {
                        call.send_head().await
                    } else {
                        tokio::time::timeout(std::time::Duration::from_secs(5), call.send())
                            .await
                            .unwrap_or_else(|_| panic!("no answer to {method} {uri} in 5 s"))
                    };
                    sent += 1;
                    let status = answer.status;
                    let allowed = allows(&param["schema"], &value);
                    let what = format!("{} {uri} ({name} = {value:?})", method.to_uppercase());
                    if !documented(status) {
                        wrong.push(format!("{what}: {status} is not documented"));
                    } else if status == 400 && allowed {
                        wrong.push(format!(
                            "{what}: 400 though the schema allows it: {}",
                            answer.text
                        ));
                    } else if status != 400 && !allowed {
                        wrong.push(format!("{what}: {status} though the schema refuses it"));
                    }
                }
            }
            if op["requestBody"].is_object() {
                let uri = params.iter().fold(path.clone(), |uri, p| {
                    let n = p["name"].as_str().unwrap();
                    uri.replace(&format!("{{{n}}}"), good(n))
                });
                let uri = uri.replace("/ok-1", &format!("/body-{sent}"));
                for (body, expected) in [
                    ("{not json".to_owned(), 400),
                    (r#"{"unknown_field": 1}"#.to_owned(), 400),
                    ("x".repeat(64 * 1024), 413),
                ] {
                    let answer = app
                        .call(&method.to_uppercase(), &uri)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    sent += 1;
                    let what = format!("{} {uri} with a bad body", method.to_uppercase());
                    if answer.status != expected {
                        wrong.push(format!("{what}: {} not {expected}", answer.status));
                    } else if !documented(answer.status) {
                        wrong.push(format!("{what}: {} is not documented", answer.status));
                    }
                }
                // Bodies of every JSON type, each refused with 400 exactly when the
                // document's schema of the body refuses it. `null` is the absent body of an
                // optional one (docs/API.md, "Conventions"): where the schema allows it, it
                // is answered as no body at all is.
                let schema = body_schema(&doc, op);
                for shape in [
                    json!(null),
                    json!([]),
                    json!("x"),
                    json!(1),
                    json!(true),
                    json!({}),
                ] {
                    let allowed = schema.is_valid(&shape);
                    let mut answers = Vec::new();
                    for body in [Some(shape.to_string()), None] {
                        if body.is_none() && !(shape.is_null() && allowed) {
                            continue;
                        }
                        let uri = uri.replace("/body-", &format!("/shape-{sent}-"));
                        let mut call = app.call(&method.to_uppercase(), &uri);
                        if let Some(body) = body {
                            call = call.header("content-type", "application/json").body(body);
                        }
                        answers.push(if path.ends_with("/hold") {
                            call.send_head().await
                        } else {
                            call.send().await
                        });
                        sent += 1;
                    }
                    let answer = &answers[0];
                    let what = format!("{} {uri} with the body {shape}", method.to_uppercase());
                    if let [with_null, without] = &answers[..] {
                        if with_null.status != without.status {
                            wrong.push(format!(
                                "{what}: {} where no body is {}",
                                with_null.status, without.status
                            ));
                        }
                    } else if !documented(answer.status) {
                        wrong.push(format!("{what}: {} is not documented", answer.status));
                    } else if answer.status == 400 && allowed {
                        wrong.push(format!(
                            "{what}: 400 though the schema allows it: {}",
                            answer.text
                        ));
                    } else if answer.status != 400 && !allowed {
                        wrong.push(format!(
                            "{what}: {} though the schema refuses it",
                            answer.status
                        ));
                    }
                }
            }
        }
    }
    assert!(sent > 300, "only {sent} requests were sent");
    assert!(
        wrong.is_empty(),
        "{} of {sent} answers disagree with the document:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
