//! Prices an order sent as JSON and answers with JSON, through serde's derive.

use serde::{Deserialize, Serialize};
use wasmless_sdk::{Request, Response, http};

mod money;

#[derive(Deserialize)]
struct Order {
    customer: String,
    items: Vec<Item>,
    #[serde(default)]
    coupon: Option<String>,
}

#[derive(Deserialize)]
struct Item {
    sku: String,
    quantity: u32,
    unit_cents: u64,
}

#[derive(Serialize)]
struct Quote<'a> {
    customer: &'a str,
    lines: usize,
    total: String,
    skus: Vec<&'a str>,
}

pub fn handler(request: Request) -> Response {
    let order: Order = match serde_json::from_slice(request.body()) {
        Ok(order) => order,
        Err(error) => return reply(400, serde_json::json!({ "error": error.to_string() })),
    };
    let mut cents: u64 = order.items.iter().map(|i| i.unit_cents * u64::from(i.quantity)).sum();
    if order.coupon.as_deref() == Some("TENOFF") {
        cents -= cents / 10;
    }
    let quote = Quote {
        customer: &order.customer,
        lines: order.items.len(),
        total: money::format(cents),
        skus: order.items.iter().map(|i| i.sku.as_str()).collect(),
    };
    reply(200, serde_json::to_value(&quote).unwrap())
}

fn reply(status: u16, body: serde_json::Value) -> Response {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap()
}
