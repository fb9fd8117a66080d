//! JSON text kept as the file spelled it: an object's members in file order with their raw
//! values ([`OrderedRawObject`]), what kind of value a text is, the number a text spells, and
//! the whitespace outside strings removed.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The value of JSON number text; `None` for any other JSON.
pub(crate) fn json_number(json: &str) -> Option<f64> {
    // Rust's parser also takes "inf" and "NaN", which JSON numbers never spell.
    let looks_numeric = json.starts_with(|c: char| c == '-' || c.is_ascii_digit());
    if !looks_numeric || serde_json::from_str::<&RawValue>(json).is_err() {
        return None;
    }
    // std's parser rounds correctly; serde_json's default one may be off by an ulp.
    json.parse::<f64>().ok()
}

pub(crate) fn json_kind(json: &str) -> &'static str {
    match json.trim_start().chars().next() {
        Some('{') => "object",
        Some('[') => "array",
        Some('"') => "string",
        Some('t' | 'f') => "boolean",
        Some('n') => "null",
        _ => "number",
    }
}

/// A JSON object's members in file order, values as their raw text. serde_json's own map sorts
/// keys (unless the workspace-wide `preserve_order` feature is on), and the file order is what
/// export restores.
pub(crate) struct OrderedRawObject(pub(crate) Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for OrderedRawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = OrderedRawObject;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = access.next_entry::<String, Box<RawValue>>()? {
                    members.push(member);
                }
                Ok(OrderedRawObject(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// Removes the whitespace outside strings of valid JSON text, so that metadata stored in a
/// config is one line (and FlashInfer's members are compact, as Python's `separators=(",", ":")`).
pub fn strip_json_whitespace(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}
