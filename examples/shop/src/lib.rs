//! Example plugin with two managers that talk through the router:
//!
//! - `orders`: `POST /orders` validates the order, asks `inventory` to
//!   reserve the stock (an awaited call to another manager), stores the
//!   order and emits `order.created`; `GET /orders/{id}` reads it back.
//! - `inventory`: `GET /inventory/{sku}` reads stock; answers the
//!   `inventory.Reserve` calls; counts the `order.created` notifications it
//!   receives (`GET /inventory-stats`).
//!
//! Run it: `switchyard up -c examples/shop/switchyard.toml` after
//! `cargo build -p switchyard-example-shop`.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use switchyard_manager::{Config, Context, Error, Event, Manager, Registry, Reply, State};

/// `POST /orders` with `{"sku": "apple", "qty": 2, "customer_id": 42}`.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "shop.CreateOrder", http = "POST /orders", reply = Created)]
pub struct CreateOrder {
    #[validate(length(min = 1, max = 32))]
    pub sku: String,
    #[validate(range(min = 1, max = 100))]
    pub qty: u32,
    pub customer_id: u64,
}

/// `GET /orders/{id}`.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "shop.GetOrder", http = "GET /orders/{id}", reply = Order)]
pub struct GetOrder {
    pub id: u64,
}

/// How many orders there are, for WebSocket and gRPC clients: no HTTP
/// route, marked `public` so that clients may send it.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "shop.CountOrders", public, reply = OrderCount)]
pub struct CountOrders {}

#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct OrderCount {
    pub orders: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, Reply)]
pub struct Order {
    pub id: u64,
    pub sku: String,
    pub qty: u32,
    pub customer_id: u64,
}

/// A created order, as a 201 reply.
#[derive(Debug, Serialize, Deserialize, Reply)]
#[reply(status = 201)]
pub struct Created {
    pub order: Order,
    pub stock_left: u32,
}

/// Notification: an order was created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Event)]
#[event(name = "order.created")]
pub struct OrderCreated {
    pub id: u64,
    pub sku: String,
    pub qty: u32,
    pub customer_id: u64,
}

/// Call from `orders` to `inventory`: no HTTP route and no `public`
/// mark, so it is internal. Only the group's managers may send it; a
/// WebSocket or gRPC client naming it gets 404, as for a type no manager
/// declares, and it is absent from `/openapi.json` and gRPC reflection.
/// Its `reply` makes `cx.call(&Reserve { .. })` give a `Reserved`.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "inventory.Reserve", reply = Reserved)]
pub struct Reserve {
    pub sku: String,
    pub qty: u32,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Reserved {
    pub remaining: u32,
}

/// The `orders` manager.
#[derive(Default)]
pub struct Orders {
    orders: HashMap<u64, Order>,
    next_id: u64,
}

impl Manager for Orders {
    const NAME: &'static str = "orders";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(Orders {
            orders: HashMap::new(),
            next_id: 1,
        })
    }
    fn register(r: &mut Registry<Self>) {
        r.handle(Self::create_order)
            .handle(Self::get_order)
            .handle(Self::count_orders);
    }
}

impl Orders {
    async fn create_order(state: State<Self>, ev: CreateOrder, cx: Context) -> Result<Created, Error> {
        // Awaiting the call lets this manager serve other requests meanwhile.
        let reserved = cx
            .call(&Reserve {
                sku: ev.sku.clone(),
                qty: ev.qty,
            })
            .await?;
        let order = state.with(|orders| {
            let id = orders.next_id;
            orders.next_id += 1;
            let order = Order {
                id,
                sku: ev.sku,
                qty: ev.qty,
                customer_id: ev.customer_id,
            };
            orders.orders.insert(id, order.clone());
            order
        });
        cx.notify(&OrderCreated {
            id: order.id,
            sku: order.sku.clone(),
            qty: order.qty,
            customer_id: order.customer_id,
        })?;
        switchyard_manager::tracing::info!(order = order.id, "order created");
        Ok(Created {
            order,
            stock_left: reserved.remaining,
        })
    }

    fn count_orders(&mut self, _: CountOrders, _: &mut Context) -> Result<OrderCount, Error> {
        Ok(OrderCount {
            orders: self.orders.len() as u64,
        })
    }

    fn get_order(&mut self, ev: GetOrder, _: &mut Context) -> Result<Order, Error> {
        self.orders
            .get(&ev.id)
            .cloned()
            .ok_or_else(|| Error::not_found(format!("no order {}", ev.id)))
    }
}

/// `GET /inventory/{sku}`.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "shop.GetStock", http = "GET /inventory/{sku}", reply = Stock)]
pub struct GetStock {
    pub sku: String,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Stock {
    pub sku: String,
    pub available: u32,
}

/// `GET /inventory-stats`.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "shop.InventoryStats", http = "GET /inventory-stats", reply = Stats)]
pub struct InventoryStats {}

#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Stats {
    pub orders_seen: u64,
    pub units_ordered: u64,
}

/// Config of `inventory`: `[managers.config] stock = { apple = 10 }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryConfig {
    #[serde(default)]
    pub stock: HashMap<String, u32>,
}

/// The `inventory` manager.
pub struct Inventory {
    stock: HashMap<String, u32>,
    orders_seen: u64,
    units_ordered: u64,
}

impl Manager for Inventory {
    const NAME: &'static str = "inventory";
    fn create(config: &Config) -> Result<Self, Error> {
        let config: InventoryConfig = config.get_or_default()?;
        Ok(Inventory {
            stock: config.stock,
            orders_seen: 0,
            units_ordered: 0,
        })
    }
    fn register(r: &mut Registry<Self>) {
        r.handle(Self::stock)
            .handle(Self::reserve)
            .handle(Self::stats)
            .on(Self::order_created);
    }
}

impl Inventory {
    fn stock(&mut self, ev: GetStock, _: &mut Context) -> Result<Stock, Error> {
        let available = *self
            .stock
            .get(&ev.sku)
            .ok_or_else(|| Error::not_found(format!("unknown sku `{}`", ev.sku)))?;
        Ok(Stock {
            sku: ev.sku,
            available,
        })
    }

    fn reserve(&mut self, ev: Reserve, _: &mut Context) -> Result<Reserved, Error> {
        let available = self
            .stock
            .get_mut(&ev.sku)
            .ok_or_else(|| Error::not_found(format!("unknown sku `{}`", ev.sku)))?;
        if *available < ev.qty {
            return Err(Error::conflict(format!(
                "only {} of `{}` left",
                available, ev.sku
            )));
        }
        *available -= ev.qty;
        Ok(Reserved {
            remaining: *available,
        })
    }

    fn stats(&mut self, _: InventoryStats, _: &mut Context) -> Result<Stats, Error> {
        Ok(Stats {
            orders_seen: self.orders_seen,
            units_ordered: self.units_ordered,
        })
    }

    fn order_created(&mut self, ev: OrderCreated, _: &mut Context) -> Result<(), Error> {
        self.orders_seen += 1;
        self.units_ordered += u64::from(ev.qty);
        Ok(())
    }
}

switchyard_manager::export_managers!(Orders, Inventory);

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_manager::testing::TestManager;

    #[test]
    fn orders_reserve_stock_and_notify() {
        let mut orders = TestManager::<Orders>::new();
        orders.stub(|r: Reserve| {
            if r.qty <= 5 {
                Ok(Reserved { remaining: 5 - r.qty })
            } else {
                Err(Error::conflict("no"))
            }
        });
        let r = orders.http::<CreateOrder>(&[], "", br#"{"sku":"apple","qty":2,"customer_id":7}"#);
        assert_eq!(r.status, 201, "{}", r.text());
        let created: serde_json::Value = r.json();
        assert_eq!(created["stock_left"], 3);
        assert_eq!(
            orders.notified::<OrderCreated>(),
            [OrderCreated {
                id: 1,
                sku: "apple".into(),
                qty: 2,
                customer_id: 7
            }]
        );
        assert_eq!(
            orders
                .http::<GetOrder>(&[("id", "1")], "", b"")
                .json::<serde_json::Value>()["sku"],
            "apple"
        );
        // The callee's 409 comes back as the caller's error.
        let r = orders.http::<CreateOrder>(&[], "", br#"{"sku":"apple","qty":9,"customer_id":7}"#);
        assert_eq!(r.status, 409, "{}", r.text());
        // Validation names the field.
        let r = orders.http::<CreateOrder>(&[], "", br#"{"sku":"apple","qty":0,"customer_id":7}"#);
        assert_eq!(r.status, 422);
        assert!(r.text().contains(r#""field":"qty""#), "{}", r.text());
    }

    #[test]
    fn inventory_counts_notifications() {
        let mut inventory = TestManager::<Inventory>::with_config(serde_json::json!({"stock": {"pear": 3}}));
        assert_eq!(
            inventory
                .request(&Reserve {
                    sku: "pear".into(),
                    qty: 2
                })
                .status,
            200
        );
        assert_eq!(
            inventory
                .request(&Reserve {
                    sku: "pear".into(),
                    qty: 2
                })
                .status,
            409
        );
        inventory.notify(&OrderCreated {
            id: 1,
            sku: "pear".into(),
            qty: 2,
            customer_id: 1,
        });
        let stats: serde_json::Value = inventory.http::<InventoryStats>(&[], "", b"").json();
        assert_eq!(stats["orders_seen"], 1);
    }
}
