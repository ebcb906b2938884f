//! Shutdown: destroy everything, and report what was still alive.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::leak::ObjectLeakReport;
use super::manager::emit;
use super::store::leak_entries;
use super::ObjectManager;

impl ObjectManager {
    /// Destroys everything and reports the objects that were still alive.
    ///
    /// Dead objects are destroyed first. Each object still alive is logged
    /// with `log::warn!` (type, key, refcount, size, creation site), or
    /// written to stderr when no logger would show a warning. Then all values
    /// are dropped, in key order, which also breaks reference cycles.
    ///
    /// If handles outlive the manager, their slot memory is leaked on purpose
    /// so they stay sound, and the report says so. Dropping the manager does
    /// the same. Panics from `Drop` impls are caught and logged here.
    ///
    /// # Panics
    ///
    /// Panics if called (or the manager dropped) from user code inside a
    /// create through this manager's own [`Loader`](crate::Loader) on the
    /// same thread, such as the iterator given to
    /// [`Loader::create_many`](crate::Loader::create_many): shutdown waits
    /// for every loader create under way, so it would wait for itself. The
    /// manager is then left as [`mem::forget`](std::mem::forget) leaves it.
    pub fn shutdown(mut self) -> ObjectLeakReport {
        self.shutdown_in_place()
    }

    /// A shutdown from user code that runs inside a create through this
    /// manager's own [`Loader`](crate::Loader), on the same thread (see
    /// `open_gate.rs`). It cannot wait for that create, which waits for it,
    /// so it leaves the manager as `mem::forget` would, and says why: with a
    /// panic, or in the log if the thread is already unwinding (a second
    /// panic would abort).
    #[cold]
    #[inline(never)]
    fn shutdown_inside_own_loader(&mut self) -> ObjectLeakReport {
        // The registry, and so every store's memory, is never freed: every
        // handle stays sound, and the create under way finishes into it.
        std::mem::forget(Arc::clone(self.registry()));
        let message = format!(
            "mmobject: object manager #{} was shut down or dropped inside a create through its own `Loader` on the \
             same thread (in the iterator given to `Loader::create_many`, or in user code that a create runs). \
             Shutdown waits for every create under way, so it would wait for itself forever. The manager is left \
             as `mem::forget` leaves it: its objects are never destroyed and its memory is never freed",
            self.id()
        );
        if std::thread::panicking() {
            log::error!(target: "mmobject", "{message}");
            return ObjectLeakReport::default();
        }
        panic!("{message}");
    }

    pub(crate) fn shutdown_in_place(&mut self) -> ObjectLeakReport {
        self.shut_down = true;
        if self.registry().gate.entered_here() {
            return self.shutdown_inside_own_loader();
        }
        // No loader creates from here on (closing waits for every create
        // under way; later ones find the manager closed).
        self.registry().gate.close();
        // Before any user code runs: if it panics, the stores leak their
        // memory rather than free it under live handles.
        for store in self.all_stores() {
            store.keep_memory();
        }
        let mut report = ObjectLeakReport::default();
        // Dead first. A panicking Drop leaves the manager consistent, so retry.
        loop {
            match catch_unwind(AssertUnwindSafe(|| self.collect_garbage())) {
                Ok(_) => break,
                Err(payload) => {
                    report.drop_panics += 1;
                    let id = self.id();
                    let message = super::leak_render::PanicMessage(&*payload);
                    log::error!(target: "mmobject", "a released object panicked in Drop at shutdown of object manager #{id}: {message}");
                }
            }
        }
        for store in self.all_stores() {
            leak_entries(store, &mut report.entries);
        }
        report.entries.sort_by_key(|e| e.key);
        if !report.entries.is_empty() {
            // Before any value is destroyed: retention paths and cycles read `visit_handles`.
            super::forensics::annotate_leaks(self, &mut report);
        }
        if self.report_leaks && !report.entries.is_empty() {
            super::leak_render::log_shutdown_report(&report, self.id(), &mut |block| emit(block));
        }
        let id = self.id();
        let registry = Arc::clone(self.registry());
        for store in registry.all_stores() {
            // SAFETY: we hold `&mut self`, and the registry is closed to loaders.
            unsafe {
                store.destroy_all(&mut |type_name, key| {
                report.drop_panics += 1;
                log::error!(target: "mmobject", "{type_name}{key} panicked in Drop at shutdown of object manager #{id}");
            })
            };
        }
        for store in registry.all_stores() {
            // SAFETY: as for `destroy_all`, which ran above.
            let settled = unsafe { store.settle() };
            report.outliving_handles += settled.outliving;
            report.owner_reserved += settled.owner_reserved;
            report.leaked_bytes += settled.leaked_bytes;
        }
        if self.report_leaks && report.outliving_handles > 0 {
            let reserved = match report.owner_reserved {
                0 => String::new(),
                n => format!(
                    " ({n} of them may be held only by counts the owner thread reserved, which only it can give \
                     back: shut the manager down on the thread that built it to free them)"
                ),
            };
            emit(&format!(
                "{} object(s) are still referenced by handles that outlive object manager #{}{reserved}; \
                 {} bytes of slot memory are leaked on purpose so those handles stay sound",
                report.outliving_handles,
                self.id(),
                report.leaked_bytes
            ));
        }
        report
    }
}
