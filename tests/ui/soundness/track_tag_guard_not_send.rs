// A tag guard restores the tag of the thread that entered it, so it cannot move to
// another thread (nor can a future that holds one across an `.await` be spawned on a
// multi-threaded executor): the tag would be restored on the wrong thread.
use mmobject::track::Tag;

static TAG: Tag = Tag::new("ui-guard");

fn main() {
    let guard = TAG.enter();
    std::thread::spawn(move || drop(guard));
}
