//! Where a namespace's and a trigger's messages live in the broker. Everything of a
//! namespace is under `wasmless.<namespace>.` and in one stream of its own, so a broker's
//! permissions on that prefix are the tenancy boundary; the namespace of a message is its
//! stream's, never a field of the message. Tokens starting with `_` are Wasmless's own
//! (dead letters; schedules later), and a trigger's subject may not start with one.

use thiserror::Error;

/// Where one trigger of one Function reads, as names the broker accepts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TriggerRef {
    pub namespace: String,
    pub function: String,
    pub trigger: String,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum NameError {
    #[error(
        "subject {subject:?}: {why}; write dot-separated tokens of letters, digits, '-' and '_', with '*' for one token or a last '>' for the rest (e.g. orders.created)"
    )]
    Subject { subject: String, why: &'static str },
    #[error(
        "subject {0:?}: a message goes to one subject, and '*' and '>' match many; name the subject a trigger reads, or one its wildcard matches (e.g. orders.created)"
    )]
    Wildcard(String),
}

/// The stream holding a namespace's messages. A namespace is a DNS label, which a stream
/// name may hold as is.
pub fn stream(namespace: &str) -> String {
    format!("WASMLESS_{namespace}")
}

/// The subjects of a namespace's stream.
pub fn namespace_subjects(namespace: &str) -> String {
    format!("wasmless.{namespace}.>")
}

/// A subject as a namespace's user names it (`orders.created`), checked, as the broker
/// spells it (`wasmless.shop.orders.created`).
pub fn subject(namespace: &str, user_subject: &str) -> Result<String, NameError> {
    check_subject(user_subject)?;
    Ok(format!("wasmless.{namespace}.{user_subject}"))
}

/// The one subject a publisher names (`orders.created`), checked as a trigger's is and
/// holding no wildcard, as the broker spells it.
pub fn publish_subject(namespace: &str, user_subject: &str) -> Result<String, NameError> {
    if user_subject.split('.').any(|token| token == "*" || token == ">") {
        return Err(NameError::Wildcard(user_subject.to_string()));
    }
    subject(namespace, user_subject)
}

/// The longest subject a namespace's user names, as the CRD's pattern allows: with the
/// namespace, it stays far below the broker's 4 KiB protocol line, which a longer one
/// would break for every namespace's messages on the component's connection.
pub const MAX_SUBJECT_BYTES: usize = 200;

fn check_subject(subject: &str) -> Result<(), NameError> {
    let refuse = |why| {
        Err(NameError::Subject {
            subject: subject.chars().take(MAX_SUBJECT_BYTES).collect(),
            why,
        })
    };
    if subject.is_empty() {
        return refuse("it is empty");
    }
    if subject.len() > MAX_SUBJECT_BYTES {
        return refuse("it is longer than 200 bytes");
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    for (index, token) in tokens.iter().enumerate() {
        let last = index + 1 == tokens.len();
        match *token {
            "" => return refuse("a token is empty"),
            "*" | ">" if index == 0 => {
                return refuse("the first token is a wildcard, which would read Wasmless's own subjects too");
            }
            "*" => {}
            ">" if last => {}
            ">" => return refuse("'>' may only be the last token"),
            _ if token.starts_with('_') && index == 0 => {
                return refuse("a first token starting with '_' is Wasmless's own");
            }
            _ if !token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') => {
                return refuse("a token holds a character other than letters, digits, '-' and '_'");
            }
            _ => {}
        }
    }
    Ok(())
}

impl TriggerRef {
    pub fn new(namespace: &str, function: &str, trigger: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            function: function.to_string(),
            trigger: trigger.to_string(),
        }
    }

    /// The durable consumer's name: unique per (Function, trigger) in the namespace's
    /// stream. A Function's name may hold dots, which a consumer's may not: each becomes
    /// `_`, which no Kubernetes name holds, so `__` between the two cannot be ambiguous.
    pub fn durable(&self) -> String {
        format!("{}__{}", self.function.replace('.', "_"), self.trigger)
    }

    /// Where a message that kept failing is parked, with its last error: in the namespace's
    /// own stream, so a namespace named `deadletter` cannot collide with it.
    pub fn dead_letter_subject(&self) -> String {
        format!(
            "wasmless.{}._deadletter.{}.{}",
            self.namespace,
            self.function.replace('.', "_"),
            self.trigger
        )
    }

    /// Where a schedule trigger's ticks are published (`schedule.rs`): Wasmless's own
    /// subject in the namespace, which no publisher names.
    pub fn schedule_subject(&self) -> String {
        format!(
            "wasmless.{}._schedule.{}.{}",
            self.namespace,
            self.function.replace('.', "_"),
            self.trigger
        )
    }

    /// The CloudEvents `source` of every event of this trigger.
    pub fn source(&self) -> String {
        format!("wasmless/{}/{}/{}", self.namespace, self.function, self.trigger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_subject_is_put_under_its_namespace() {
        assert_eq!(
            subject("shop", "orders.created").unwrap(),
            "wasmless.shop.orders.created"
        );
        assert_eq!(subject("shop", "orders.*").unwrap(), "wasmless.shop.orders.*");
        assert_eq!(subject("shop", "orders.>").unwrap(), "wasmless.shop.orders.>");
    }

    #[test]
    fn subjects_that_would_leave_their_place_are_refused() {
        for bad in [
            "",
            "orders..created",
            "orders.>.x",
            "_deadletter.f",
            "orders created",
            "a.b/c",
            "a.".repeat(2100).as_str(),
        ] {
            let error = subject("shop", bad).unwrap_err();
            assert!(error.to_string().contains("e.g. orders.created"), "{error}");
        }
    }

    #[test]
    fn a_publisher_names_one_subject_of_its_namespace() {
        assert_eq!(
            publish_subject("shop", "orders.created").unwrap(),
            "wasmless.shop.orders.created"
        );
        for bad in ["orders.*", ">", "orders.>"] {
            assert_eq!(publish_subject("shop", bad), Err(NameError::Wildcard(bad.into())));
        }
        assert!(matches!(
            publish_subject("shop", "_deadletter.f.t"),
            Err(NameError::Subject { .. })
        ));
    }

    #[test]
    fn consumers_of_functions_with_dots_do_not_collide() {
        let dotted = TriggerRef::new("shop", "a.b", "c");
        let dashed = TriggerRef::new("shop", "a-b", "c");
        assert_eq!(dotted.durable(), "a_b__c");
        assert_ne!(dotted.durable(), dashed.durable());
        assert_ne!(
            TriggerRef::new("shop", "a", "b-c").durable(),
            TriggerRef::new("shop", "a-b", "c").durable()
        );
        assert!(dotted.dead_letter_subject().starts_with("wasmless.shop._deadletter."));
    }
}
