//! Renderers: pure functions from a result to text.
