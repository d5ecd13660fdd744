//! `#[process_manager]` on a generic impl (the dependencies are generic, the
//! state and messages concrete), with the other options: a default name,
//! `on_complete`, `concurrency`, strict handlers, `#[correlate]` through the
//! parameters' own names, tuple and enum messages, and `#[on_error]`.
use saga_runtime::prelude::*;
use saga_runtime::process::{Concurrency, Correlation, HandlerKind, OnComplete};
use serde::{Deserialize, Serialize};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> u64;
}

pub struct Fixed(u64);

impl Clock for Fixed {
    fn now(&self) -> u64 {
        self.0
    }
}

#[derive(Message, Serialize, Deserialize)]
#[message(name = "account-opened")]
pub struct AccountOpened(#[correlation_id] pub u64, pub String);

#[derive(Message, Serialize, Deserialize)]
pub struct Deposited {
    pub account: String,
    pub amount: u64,
}

#[derive(Message, Serialize, Deserialize)]
pub enum Audit {
    Daily,
    Monthly { month: u8 },
}

/// A generic message: `Message` is implemented where serde's impls are.
#[derive(Message, Serialize, Deserialize)]
pub struct Tagged<T> {
    #[correlation_id]
    pub tag: T,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Account {
    pub number: String,
    pub balance: u64,
    pub last_change: u64,
}

pub struct AccountWatch<C: Clock> {
    clock: C,
}

#[process_manager(state = Account, on_complete = delete, concurrency = pessimistic)]
impl<C: Clock> AccountWatch<C>
where
    C: Sized,
{
    #[starts(strict)]
    #[correlate(account.number = opened.1)]
    async fn opened(
        &self,
        opened: AccountOpened,
        account: &mut Account,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = opened.0;
        account.last_change = self.clock.now();
        ctx.request_timeout(std::time::Duration::from_secs(86_400), Audit::Daily);
        Ok(())
    }

    #[saga_runtime::handles(strict = true)]
    #[correlate(state.number = msg.account)]
    async fn deposited(
        &self,
        deposit: Deposited,
        account: &mut Account,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        let _ = ctx;
        account.balance += deposit.amount;
        account.last_change = self.clock.now();
        Ok(())
    }

    #[timeout]
    async fn audit(
        &self,
        audit: Audit,
        account: &mut Account,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        if let Audit::Monthly { month } = audit {
            account.last_change = u64::from(month);
        }
        ctx.mark_complete();
        Ok(())
    }

    #[on_error]
    fn decide(&self, failure: &Failure) -> ErrorAction {
        match failure.kind {
            FailureKind::NotStarted => ErrorAction::Skip,
            _ => ErrorAction::Stop,
        }
    }
}

fn main() {
    type Watch = AccountWatch<Fixed>;
    assert_eq!(<Watch as ProcessManager>::NAME, "account-watch");
    let def = Watch::definition();
    assert_eq!(def.on_complete, OnComplete::Delete);
    assert_eq!(def.concurrency, Concurrency::Pessimistic);
    let opened = def.handler("account-opened").unwrap();
    assert_eq!(opened.kind, HandlerKind::Starts { strict: true });
    assert_eq!(
        opened.correlation,
        Correlation::Field {
            state_field: "number",
            message_field: "1"
        }
    );
    let deposited = def.handler("Deposited").unwrap();
    assert_eq!(deposited.kind, HandlerKind::Handles { strict: true, many: false });
    assert_eq!(def.handler("Audit").unwrap().kind, HandlerKind::Timeout);

    let msg = serde_json::json!([42, "ACC-1"]);
    assert_eq!(
        Watch::message_key("account-opened", &msg).unwrap(),
        Some("ACC-1".to_owned())
    );
    let mut account = Account::default();
    Watch::seed("account-opened", &msg, &mut account).unwrap();
    assert_eq!(account.number, "ACC-1");
    // Both handlers correlate on `number`: one index key.
    assert_eq!(
        Watch::state_keys(&account),
        vec![("number", "ACC-1".to_owned())]
    );
    assert_eq!(
        AccountOpened(42, String::new()).correlation_id(),
        Some("42".to_owned())
    );
    assert_eq!(Audit::Daily.correlation_id(), None);
    assert_eq!(<Audit as Message>::TYPE, "Audit");
    assert_eq!(<Tagged<u8> as Message>::TYPE, "Tagged");
    assert_eq!(Tagged { tag: 3u8 }.correlation_id(), Some("3".to_owned()));

    let watch = AccountWatch { clock: Fixed(5) };
    assert_eq!(watch.clock.now(), 5);
    let failure = Failure {
        kind: FailureKind::NotStarted,
        error: String::new(),
        message_type: "Deposited".to_owned(),
        message_id: "m".to_owned(),
        instance_id: None,
        failures: 1,
    };
    assert_eq!(
        ProcessManager::on_error(&watch, &failure),
        ErrorAction::Skip
    );
}
