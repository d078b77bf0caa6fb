//! Reading a result document by JSON pointer (`/rtt_ns/p50`), panicking with the pointer and
//! the whole document when the value is missing or of another type.

use serde_json::Value;

/// The unsigned integer at `pointer`.
pub(crate) fn u(doc: &Value, pointer: &str) -> u64 {
    doc.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} is not an unsigned integer in\n{doc:#}"))
}

/// The number at `pointer`.
pub(crate) fn f(doc: &Value, pointer: &str) -> f64 {
    doc.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{pointer} is not a number in\n{doc:#}"))
}

/// The string at `pointer`.
pub(crate) fn s<'a>(doc: &'a Value, pointer: &str) -> &'a str {
    doc.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} is not a string in\n{doc:#}"))
}

/// The array at `pointer`.
pub(crate) fn arr<'a>(doc: &'a Value, pointer: &str) -> &'a Vec<Value> {
    doc.pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{pointer} is not an array in\n{doc:#}"))
}
