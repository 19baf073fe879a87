#[allow(dead_code)]
mod config;

fn main() {}
