//! A money transfer as a process manager (after Commanded's example): it
//! starts on `MoneyTransferRequested` (and sends `WithdrawMoney`), continues
//! on `MoneyWithdrawn` (and sends `DepositMoney`), and stops, deleting its
//! state, on `MoneyDeposited`.
//!
//! ```text
//! cargo run --example money_transfer
//! ```

use std::time::Duration;

use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct MoneyTransferRequested {
    #[correlation_id]
    pub transfer_id: String,
    pub debit_account: String,
    pub credit_account: String,
    pub amount: u64,
}

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct MoneyWithdrawn {
    #[correlation_id]
    pub transfer_id: String,
}

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct MoneyDeposited {
    #[correlation_id]
    pub transfer_id: String,
}

/// Commands to the accounts service.
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct WithdrawMoney {
    pub transfer_id: String,
    pub account: String,
    pub amount: u64,
}

#[derive(Debug, Message, Serialize, Deserialize)]
pub struct DepositMoney {
    pub transfer_id: String,
    pub account: String,
    pub amount: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TransferState {
    pub debit_account: String,
    pub credit_account: String,
    pub amount: u64,
    pub status: String,
}

pub struct TransferMoney;

#[process_manager(name = "transfer-money", state = TransferState)]
impl TransferMoney {
    #[starts]
    async fn requested(
        &self,
        msg: MoneyTransferRequested,
        state: &mut TransferState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.debit_account = msg.debit_account.clone();
        state.credit_account = msg.credit_account;
        state.amount = msg.amount;
        state.status = "withdrawing".into();
        ctx.send(
            "accounts",
            WithdrawMoney {
                transfer_id: msg.transfer_id,
                account: msg.debit_account,
                amount: msg.amount,
            },
        );
        Ok(())
    }

    #[handles]
    async fn withdrawn(
        &self,
        msg: MoneyWithdrawn,
        state: &mut TransferState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.status = "depositing".into();
        ctx.send(
            "accounts",
            DepositMoney {
                transfer_id: msg.transfer_id,
                account: state.credit_account.clone(),
                amount: state.amount,
            },
        );
        Ok(())
    }

    #[handles]
    async fn deposited(
        &self,
        _msg: MoneyDeposited,
        _state: &mut TransferState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        ctx.stop(); // done: delete the instance's state
        Ok(())
    }
}

async fn show(engine: &Engine, step: &str) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    let state = engine.process_state::<TransferMoney>("t-1").await?;
    println!("after {step:<24} state: {state:?}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::builder()
        .process_manager(TransferMoney)
        .build()
        .await?;
    engine
        .publish(MoneyTransferRequested {
            transfer_id: "t-1".into(),
            debit_account: "ACC-1".into(),
            credit_account: "ACC-2".into(),
            amount: 250,
        })
        .await?;
    show(&engine, "MoneyTransferRequested").await?;
    engine
        .publish(MoneyWithdrawn {
            transfer_id: "t-1".into(),
        })
        .await?;
    show(&engine, "MoneyWithdrawn").await?;
    engine
        .publish(MoneyDeposited {
            transfer_id: "t-1".into(),
        })
        .await?;
    show(&engine, "MoneyDeposited").await?;
    // A late continuing message for the finished transfer finds no
    // instance: held for one (an hour by default), then dead-lettered.
    engine
        .publish(MoneyWithdrawn {
            transfer_id: "t-1".into(),
        })
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!(
        "late MoneyWithdrawn matched no instance: held for one (held counter = {})",
        engine
            .process_metrics()
            .held
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    for command in engine
        .process_store()?
        .endpoint_messages("accounts")
        .await?
    {
        println!("sent to accounts: {command}");
    }
    Ok(())
}
