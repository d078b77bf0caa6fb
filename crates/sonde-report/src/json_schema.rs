//! The JSON Schema of the result document, generated from the model.
//!
//! The same schema is committed at `schema/sonde-result.schema.json` in the repository, for
//! people and tools outside Rust; a test fails when the two drift apart
//! (`SONDE_UPDATE_SCHEMA=1 cargo test -p sonde-report` rewrites the file).

use serde_json::Value;

use crate::model::TestResult;

/// The JSON Schema (draft-07) every document rendered by [`crate::render::json`] satisfies.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(TestResult))
        .expect("a generated schema always serializes")
}

/// [`schema`] as the committed file holds it: pretty JSON with a trailing newline.
pub fn schema_pretty() -> String {
    let mut s = serde_json::to_string_pretty(&schema()).expect("a JSON value always serializes");
    s.push('\n');
    s
}

/// Checks `doc` against [`schema`]: `Err` lists every violation as `<JSON pointer>: <what>`,
/// e.g. `/: "rtt_ns" is a required property` or `/results/1/result/rtt_ns/p50: "1" is not of
/// type "integer"`.
///
/// A document is checked against the variant its `test` tag names (recursively for quick cases),
/// so the errors point at the faulty field rather than at "no variant matched".
///
/// Behind the `schema-validate` feature, which pulls in the `jsonschema` crate; tests enable it
/// (`sonde-report = { workspace = true, features = ["schema-validate"] }` in dev-dependencies).
#[cfg(feature = "schema-validate")]
pub fn validate(doc: &Value) -> Result<(), Vec<String>> {
    let errors = Validator::new(&schema())?.check(doc, "");
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// The whole schema, and each variant alone (with the shared definitions) for precise errors.
#[cfg(feature = "schema-validate")]
struct Validator {
    whole: jsonschema::JSONSchema,
    variants: Vec<(String, jsonschema::JSONSchema)>,
}

#[cfg(feature = "schema-validate")]
impl Validator {
    fn new(root: &Value) -> Result<Self, Vec<String>> {
        let compile = |s: &Value| {
            jsonschema::JSONSchema::compile(s)
                .map_err(|e| vec![format!("the schema does not compile: {e}")])
        };
        let mut variants = Vec::new();
        for variant in root["oneOf"].as_array().into_iter().flatten() {
            let Some(tag) = variant
                .pointer("/properties/test/enum/0")
                .and_then(Value::as_str)
            else {
                continue;
            };
            let mut alone = variant.clone();
            alone["$schema"] = root["$schema"].clone();
            alone["definitions"] = root["definitions"].clone();
            variants.push((tag.to_owned(), compile(&alone)?));
        }
        Ok(Self {
            whole: compile(root)?,
            variants,
        })
    }

    /// The violations in `doc`, which sits at JSON pointer `at` in the checked document.
    fn check(&self, doc: &Value, at: &str) -> Vec<String> {
        let tag = doc.get("test");
        let variant = tag
            .and_then(Value::as_str)
            .and_then(|t| self.variants.iter().find(|(name, _)| name == t));
        let Some((_, variant)) = variant else {
            if self.whole.is_valid(doc) {
                return Vec::new();
            }
            let names: Vec<&str> = self.variants.iter().map(|(n, _)| n.as_str()).collect();
            let got = tag.map_or_else(|| "nothing".to_owned(), Value::to_string);
            return vec![format!(
                "{at}/test: must be one of {}, got {got}",
                names.join(", ")
            )];
        };
        let Err(errors) = variant.validate(doc) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in errors {
            let path = e.instance_path.to_string();
            if matches!(
                e.kind,
                jsonschema::error::ValidationErrorKind::OneOfNotValid
            ) {
                // A nested result (a quick case): check it against its own variant.
                if let Some(nested) = doc.pointer(&path).filter(|_| !path.is_empty()) {
                    out.extend(self.check(nested, &format!("{at}{path}")));
                    continue;
                }
            }
            let full = format!("{at}{path}");
            let full = if full.is_empty() {
                "/".to_owned()
            } else {
                full
            };
            out.push(format!("{full}: {e}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn committed_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schema/sonde-result.schema.json")
    }

    #[test]
    fn committed_schema_is_current() {
        let path = committed_path();
        let generated = schema_pretty();
        if std::env::var_os("SONDE_UPDATE_SCHEMA").is_some_and(|v| v == "1") {
            std::fs::write(&path, &generated)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            return;
        }
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
            .replace("\r\n", "\n");
        assert!(
            committed == generated,
            "{} is not the schema of the current model. If the model change is intended, \
             regenerate it with `SONDE_UPDATE_SCHEMA=1 cargo test -p sonde-report` and commit it \
             (and mind the clients reading the JSON).",
            path.display()
        );
    }
}

/// Needs the `schema-validate` feature, which the crate's dev-dependency on itself turns on.
#[cfg(all(test, feature = "schema-validate"))]
mod validate_tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures;

    #[test]
    fn every_fixture_is_valid() {
        for (name, r) in fixtures::all() {
            let doc = serde_json::to_value(&r).expect("serializes");
            assert_eq!(validate(&doc), Ok(()), "{name}");
        }
    }

    fn latency_doc() -> Value {
        serde_json::to_value(fixtures::latency_tcp()).expect("serializes")
    }

    #[test]
    fn a_document_without_rtt_is_rejected() {
        let mut doc = latency_doc();
        doc.as_object_mut().expect("an object").remove("rtt_ns");
        let errors = validate(&doc).expect_err("rtt_ns is required");
        assert_eq!(errors, ["/: \"rtt_ns\" is a required property"]);
    }

    #[test]
    fn an_unknown_test_is_rejected() {
        let mut doc = latency_doc();
        doc["test"] = json!("nope");
        assert_eq!(
            validate(&doc),
            Err(vec![
                "/test: must be one of latency, throughput, pps, crr, quick, load, sweep, conf, mtu, got \"nope\"".to_owned()
            ])
        );
        doc.as_object_mut().expect("an object").remove("test");
        assert!(validate(&doc).is_err());
        assert!(validate(&json!([])).is_err());
    }

    #[test]
    fn wrong_types_and_negative_counts_are_rejected() {
        for (field, value) in [
            ("/rtt_ns/p50", json!("38911")),
            ("/rtt_ns/mean", Value::Null), // what serde_json writes for NaN
            ("/sent", json!(-1)),
            ("/protocol", json!("sctp")),
            ("/mode", json!("closedloop")),
            ("/warnings", json!("one string")),
        ] {
            let mut doc = latency_doc();
            *doc.pointer_mut(field).expect("the field exists") = value;
            assert!(validate(&doc).is_err(), "{field} accepted");
        }
    }

    #[test]
    fn a_quick_case_is_validated_too() {
        let mut doc = serde_json::to_value(fixtures::quick_all()).expect("serializes");
        doc["results"][4]["result"]
            .as_object_mut()
            .expect("an object")
            .remove("received_pps");
        doc["results"][1]["result"]["rtt_ns"]["p50"] = json!("1");
        let errors = validate(&doc).expect_err("two faults");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors
                .contains(&"/results/4/result: \"received_pps\" is a required property".to_owned()),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("/results/1/result/rtt_ns/p50: ")),
            "{errors:?}"
        );
    }

    #[test]
    fn unknown_fields_are_allowed_for_forward_compatibility() {
        let mut doc = latency_doc();
        doc["added_in_a_later_version"] = json!(1);
        assert_eq!(validate(&doc), Ok(()));
    }

    #[test]
    fn null_percentiles_are_valid() {
        let doc = serde_json::to_value(fixtures::latency_with_warnings()).expect("serializes");
        assert_eq!(doc["rtt_ns"]["p99"], Value::Null);
        assert_eq!(validate(&doc), Ok(()));
    }
}
