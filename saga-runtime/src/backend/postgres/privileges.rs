//! The privileges an engine's statements need on its schema, checked once
//! at start: a role missing one is told which, and the `GRANT` that gives
//! it, before any work is taken (the first statement to need it may come
//! hours later, a retention pass's `DELETE`).
//!
//! What an engine needs: `USAGE` on the schema; `SELECT`, `INSERT`,
//! `UPDATE` and `DELETE` on its tables (`SELECT` alone on
//! `schema_version`); `USAGE` on its sequences; `EXECUTE` on its
//! functions. Creating or upgrading the schema needs more (`CREATE` on the
//! database, ownership of the schema's objects): a deploy job's, see
//! `PostgresBackend::migrate`.

use sqlx::postgres::PgPool;

use super::failure;
use crate::backend::BackendError;

/// How many missing privileges a refusal lists.
const LISTED: i64 = 8;

/// Refuses with the privileges the current role lacks on `schema`, if any.
pub(super) async fn missing(pool: &PgPool, schema: &str) -> Result<(), BackendError> {
    let (role, count, listed): (String, i64, Option<String>) = sqlx::query_as(
        "WITH needed AS (
             SELECT format('USAGE on schema %I', $1::text) AS privilege
              WHERE NOT has_schema_privilege($1::text, 'USAGE')
             UNION ALL
             SELECT format('%s on table %I.%I', p, n.nspname, c.relname)
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
                    unnest(CASE WHEN c.relname = 'schema_version' THEN ARRAY['SELECT']
                                ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END) AS p
              WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
                AND has_schema_privilege($1::text, 'USAGE')
                AND NOT has_table_privilege(c.oid, p)
             UNION ALL
             SELECT format('USAGE on sequence %I.%I', n.nspname, c.relname)
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = $1 AND c.relkind = 'S'
                AND has_schema_privilege($1::text, 'USAGE')
                -- (guarded: the planner may test a row before its kind)
                AND CASE WHEN c.relkind = 'S' THEN NOT has_sequence_privilege(c.oid, 'USAGE')
                         ELSE false END
             UNION ALL
             SELECT format('EXECUTE on function %s', p.oid::regprocedure)
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = $1
                AND has_schema_privilege($1::text, 'USAGE')
                AND NOT has_function_privilege(p.oid, 'EXECUTE')
         )
         SELECT current_user::text, count(*),
                string_agg(privilege, ', ') FILTER (WHERE n <= $2)
           FROM (SELECT privilege, row_number() OVER (ORDER BY privilege) AS n FROM needed) m",
    )
    .bind(schema)
    .bind(LISTED)
    .fetch_one(pool)
    .await
    .map_err(failure)?;
    let Some(listed) = listed else {
        return Ok(());
    };
    let more = match count - LISTED {
        n if n > 0 => format!(" and {n} more"),
        _ => String::new(),
    };
    Err(BackendError::Misconfigured(format!(
        "role `{role}` lacks what an engine needs on schema `{schema}`: {listed}{more}. Grant it \
         (as the schema's owner): GRANT USAGE ON SCHEMA {schema} TO {role}; GRANT SELECT, INSERT, \
         UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}; GRANT USAGE ON ALL SEQUENCES \
         IN SCHEMA {schema} TO {role}; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}"
    )))
}
