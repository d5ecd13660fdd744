//! `#[saga]` on a trait implementation.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Request;
#[derive(Serialize, Deserialize)]
pub struct Uploaded;
#[derive(Serialize, Deserialize)]
pub struct Paid;

pub struct CreateZip;

pub trait Steps {
    fn run(&self);
}

#[saga]
impl Steps for CreateZip {
    fn run(&self) {}
}

fn main() {}
