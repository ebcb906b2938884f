use mmobject::alloc::Pool;

fn main() {
    let boxed;
    {
        let pool = Pool::with_capacity(4);
        boxed = pool.alloc(1u64);
    }
    println!("{}", *boxed); // a PoolBox cannot outlive its pool
}
