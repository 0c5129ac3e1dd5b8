//! Load generator (filled in later).
fn main() {}
