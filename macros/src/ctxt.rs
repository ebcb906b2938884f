//! Collects the errors of one derive, so the user sees all of them at once.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::Span;

/// The errors found while reading and checking one `#[derive(MMObject)]` input.
///
/// Every stage pushes into the same context instead of returning at the first
/// problem, so one compile shows every mistake in the input.
#[derive(Default)]
pub struct Ctxt {
    errors: RefCell<Option<syn::Error>>,
}

impl Ctxt {
    /// Records `error`.
    pub fn push(&self, error: syn::Error) {
        let mut errors = self.errors.borrow_mut();
        match errors.as_mut() {
            Some(first) => first.combine(error),
            None => *errors = Some(error),
        }
    }

    /// Records an error with `message` at `span`.
    pub fn error_at(&self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Ends collection: `Err` with every recorded error combined, if there were any.
    pub fn finish(self) -> syn::Result<()> {
        match self.errors.into_inner() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
