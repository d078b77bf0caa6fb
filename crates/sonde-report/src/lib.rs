//! sonde's result model (the JSON contract, with its JSON Schema) and pure renderers: a table for
//! people, JSON and CSV for programs. Renderers take a result and return text; they never print.
#![forbid(unsafe_code)]

pub mod model;
pub mod render;

pub use model::*;
