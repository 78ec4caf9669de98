//! What the pool keeps loaded: the code its Functions hold, against two budgets, because
//! code costs two things. Code in the process's memory (and what wasmtime builds from any
//! code) is private memory, `--pool-memory-budget`; code mapped from a file the pool wrote
//! is page cache on the pod's disk, shared and paged in where touched,
//! `--pool-mapped-code-budget`. Code mapped from the node's store is the node's one copy:
//! neither budget pays for its pages, only for what the process builds from it.

use wasmless_host::code_cost::CodeCost;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub memory: u64,
    pub mapped: u64,
}

impl Budget {
    /// Whether loaded code costing `total` together stays within both budgets.
    pub fn fits(&self, total: CodeCost) -> bool {
        total.private <= self.memory && total.mapped <= self.mapped
    }

    /// Whether a Function may still be loaded ahead of its first request with `total`
    /// loaded: under three quarters of each budget, so that loading ahead never unloads a
    /// Function that serves.
    pub fn has_room_ahead(&self, total: CodeCost) -> bool {
        total.private < self.memory / 4 * 3 && total.mapped < self.mapped / 4 * 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Budget = Budget {
        memory: 100,
        mapped: 1000,
    };

    fn cost(private: u64, mapped: u64) -> CodeCost {
        CodeCost {
            private,
            mapped,
            shared: 0,
        }
    }

    #[test]
    fn either_budget_full_is_full() {
        assert!(BUDGET.fits(cost(100, 1000)));
        assert!(!BUDGET.fits(cost(101, 0)), "private memory over its budget");
        assert!(!BUDGET.fits(cost(0, 1001)), "mapped code over its budget");
        let stored = CodeCost {
            shared: 1 << 40,
            ..cost(100, 1000)
        };
        assert!(BUDGET.fits(stored), "the node's store's code is on neither budget");
    }

    #[test]
    fn loading_ahead_stops_at_three_quarters_of_either() {
        assert!(BUDGET.has_room_ahead(cost(74, 749)));
        assert!(!BUDGET.has_room_ahead(cost(75, 0)));
        assert!(!BUDGET.has_room_ahead(cost(0, 750)));
    }
}
