use mmobject::MMObject;

#[derive(MMObject)]
union Bits {
    int: u32,
    float: f32,
}

fn main() {}
