//! Overdue invoices as a process manager: `InvoiceIssued` and `InvoicePaid`
//! may arrive in either order; forty days after issue, a check publishes
//! `InvoiceOverdue` only if the invoice is still unpaid; payment completes
//! the instance (so a check that fires later is ignored).
//!
//! ```text
//! cargo run --example overdue_invoice
//! ```
//!
//! Forty days are scaled down to 400 ms here (the process manager takes the
//! delay as a dependency); everything else is as in production, on the
//! in-memory backend.

use std::time::Duration;

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct InvoiceIssued {
    pub invoice_number: u64,
    pub amount_cents: u64,
}

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct InvoicePaid {
    pub invoice_number: u64,
}

/// The forty-day check, delivered to the instance that scheduled it.
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct CheckPayment;

/// Published when an invoice is overdue.
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct InvoiceOverdue {
    pub invoice_number: u64,
    pub amount_cents: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct InvoiceState {
    pub invoice_number: u64,
    pub amount_cents: u64,
    pub issued: bool,
    pub paid: bool,
    pub overdue: bool,
}

pub struct OverdueInvoices {
    /// Forty days in production.
    pub check_after: Duration,
}

#[process_manager(name = "overdue-invoices", state = InvoiceState)]
impl OverdueInvoices {
    #[starts]
    #[correlate(state.invoice_number = msg.invoice_number)]
    async fn issued(
        &self,
        msg: InvoiceIssued,
        state: &mut InvoiceState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.issued = true;
        state.amount_cents = msg.amount_cents;
        if state.paid {
            ctx.mark_complete(); // paid before it was issued: nothing can be overdue
        } else {
            ctx.request_timeout(self.check_after, CheckPayment);
        }
        Ok(())
    }

    #[starts]
    #[correlate(state.invoice_number = msg.invoice_number)]
    async fn paid(
        &self,
        _msg: InvoicePaid,
        state: &mut InvoiceState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.paid = true;
        if state.issued {
            ctx.mark_complete();
        }
        Ok(())
    }

    #[timeout]
    async fn check(
        &self,
        _t: CheckPayment,
        state: &mut InvoiceState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if !state.paid {
            state.overdue = true;
            ctx.publish(InvoiceOverdue {
                invoice_number: state.invoice_number,
                amount_cents: state.amount_cents,
            });
        }
        ctx.mark_complete();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let check_after = Duration::from_millis(400);
    let engine = Engine::builder()
        .process_manager(OverdueInvoices { check_after })
        .timeout_poll_interval(Duration::from_millis(20))
        .build()
        .await?;

    // 1001: issued, paid in time. 1002: issued, never paid. 1003: paid
    // before the issue event arrived (out of order).
    engine
        .publish(InvoiceIssued {
            invoice_number: 1001,
            amount_cents: 12_000,
        })
        .await?;
    engine
        .publish(InvoiceIssued {
            invoice_number: 1002,
            amount_cents: 4_500,
        })
        .await?;
    engine
        .publish(InvoicePaid {
            invoice_number: 1003,
        })
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    engine
        .publish(InvoicePaid {
            invoice_number: 1001,
        })
        .await?;
    engine
        .publish(InvoiceIssued {
            invoice_number: 1003,
            amount_cents: 990,
        })
        .await?;
    println!("waiting for the forty-day checks ({check_after:?} in this demo) ...");
    tokio::time::sleep(check_after + Duration::from_millis(400)).await;

    for number in ["1001", "1002", "1003"] {
        let instance = engine
            .find_process::<OverdueInvoices>("invoice_number", number)
            .await?
            .expect("instance exists");
        let state: InvoiceState = serde_json::from_value(instance.state.clone())?;
        println!(
            "invoice {number}: issued={} paid={} overdue={} -> instance {:?}",
            state.issued, state.paid, state.overdue, instance.status
        );
        for entry in &instance.audit_log {
            println!("    {:<14} {:?}", entry.message_type, entry.action);
        }
    }
    let overdue = engine
        .process_store()?
        .endpoint_messages("published")
        .await?;
    println!("published: {overdue:?}");
    Ok(())
}
