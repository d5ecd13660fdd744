//! Our script invocation (`invocation.rs`): the command it builds is the
//! one redis-rs built (what the scripts receive, and where a cluster sends
//! it, did not change), and a script the server no longer has (`SCRIPT
//! FLUSH`, a restart, a failover to a replica that never saw it) is loaded
//! again, on the shared connection and on a durable write's pipeline.

use std::time::Duration;

use redis::{Cmd, Script};

use super::Fixture;
use crate::backend::redis::scripts::{Invocation, CREATE};
use crate::backend::redis::{Durability, RedisBackend, RedisConfig};

/// The command redis-rs's `ScriptInvocation` sends for the same keys and
/// arguments.
fn theirs(script: &Script, keys: &[&str], args: &[&str]) -> Vec<u8> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    for arg in args {
        invocation.arg(*arg);
    }
    let mut pipe = redis::pipe();
    pipe.invoke_script(&invocation);
    let cmd: &Cmd = pipe.cmd_iter().next().expect("one command");
    cmd.get_packed_command()
}

#[test]
fn the_command_is_the_one_redis_rs_built() {
    let keys = ["saga:{0}:task:a", "saga:{0}:queue"];
    let args = ["{\"n\":1}", "", "42"];
    let mut ours = Invocation::new(&CREATE);
    for key in keys {
        ours.key(key);
    }
    for arg in args {
        ours.arg(arg);
    }
    assert_eq!(
        ours.ready().cmd.get_packed_command(),
        theirs(&CREATE, &keys, &args)
    );

    let mut none = Invocation::new(&CREATE);
    none.key(keys[0]);
    assert_eq!(
        none.ready().cmd.get_packed_command(),
        theirs(&CREATE, &keys[..1], &[]),
        "a call without arguments"
    );
    assert_eq!(
        Invocation::new(&CREATE).ready().cmd.get_packed_command(),
        theirs(&CREATE, &[], &[]),
        "a call without keys or arguments"
    );
}

#[test]
fn a_key_after_an_argument_still_goes_among_the_keys() {
    let mut late = Invocation::new(&CREATE);
    late.key("k1").arg("a1").arg("a2").key("k2").arg("a3");
    assert_eq!(
        late.ready().cmd.get_packed_command(),
        theirs(&CREATE, &["k1", "k2"], &["a1", "a2", "a3"])
    );
}

/// Drops every script the server has, as `SCRIPT FLUSH` by an operator
/// (or a restarted server) does.
async fn flush(f: &mut Fixture) {
    let _: () = f.cmd(&["SCRIPT", "FLUSH"]).await;
}

async fn has(f: &mut Fixture, script: &Script) -> bool {
    let exists: Vec<bool> = f.cmd(&["SCRIPT", "EXISTS", script.get_hash()]).await;
    exists == [true]
}

#[tokio::test]
async fn a_flushed_script_is_loaded_again() {
    let mut f = Fixture::new().await;
    let create = f.create("{}");
    assert_eq!(f.call(&create).await.unwrap(), None, "created");
    flush(&mut f).await;
    assert!(!has(&mut f, &CREATE).await);
    assert!(
        f.call(&create).await.unwrap().is_some(),
        "ran again, found the task"
    );
    assert!(has(&mut f, &CREATE).await, "loaded again");
}

#[tokio::test]
async fn the_backend_loads_a_flushed_script_again() {
    let mut f = Fixture::new().await;
    let backend = RedisBackend::connect(&f._server.url()).await.unwrap();
    let create = f.create("{}");
    assert_eq!(backend.call(&create).await.unwrap(), None);
    flush(&mut f).await;
    assert!(backend.call(&create).await.unwrap().is_some());
    assert!(has(&mut f, &CREATE).await);
}

/// A durable write goes with its wait in a pipeline of its own: after a
/// flush, the script is loaded on that connection and the write sent
/// again. No replica here, so the wait for one times out: the write ran
/// (the task is there), and only the level was not reached.
#[tokio::test]
async fn a_durable_write_loads_a_flushed_script_again() {
    let mut f = Fixture::new().await;
    let config = RedisConfig {
        durability: Durability::Replicated {
            replicas: 1,
            timeout: Duration::from_millis(50),
        },
        ..RedisConfig::default()
    };
    let backend = RedisBackend::connect_with(&f._server.url(), config)
        .await
        .unwrap();
    let create = f.create("{}");
    flush(&mut f).await;
    assert!(!has(&mut f, &CREATE).await);
    let error = backend.call(&create).await.unwrap_err().to_string();
    assert!(error.contains("did not reach"), "{error}");
    assert!(has(&mut f, &CREATE).await, "loaded on the pipeline");
    let task: bool = f.cmd(&["EXISTS", &create.task]).await;
    assert!(task, "the write ran");
}
