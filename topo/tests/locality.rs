//! Locality on a described machine (two sockets, an HCA on each) and on
//! this one.

use xrcbtl_topo::{Candidate, IndexSet, Nearness, Topo};

fn two_sockets() -> Topo {
    Topo::from_xml_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/two-sockets.xml"
    ))
    .expect("the fixture loads")
}

fn candidate(name: &str, aliases: &[&str]) -> Candidate {
    Candidate {
        name: name.into(),
        aliases: aliases.iter().map(|a| a.to_string()).collect(),
    }
}

#[test]
fn a_device_is_found_by_name_with_its_socket() {
    let t = two_sockets();
    assert!(!t.is_this_system());
    let l = t.locality(&["mlx5_1"]).expect("mlx5_1 is in the fixture");
    assert_eq!(l.found_as, "mlx5_1");
    assert_eq!(l.cpus, IndexSet::new([2, 3]));
    assert_eq!(l.numa_node(), Some(1));
    assert_eq!(l.pci.as_deref(), Some("0000:81:00.0"));
    assert!(!l.whole_machine);
    let l = t.locality(&["mlx5_0"]).unwrap();
    assert_eq!((&l.cpus, l.numa_node()), (&IndexSet::new([0, 1]), Some(0)));
}

#[test]
fn a_software_device_is_found_by_its_interface() {
    let t = two_sockets();
    // rxe0 is not an OpenFabrics object of the topology; it runs on eth0.
    assert_eq!(t.locality(&["rxe0"]), None);
    let l = t.locality(&["rxe0", "eth0"]).expect("found through eth0");
    assert_eq!(l.found_as, "eth0");
    assert_eq!(l.numa_node(), Some(0));
    // A name that is some other kind of OS device is not taken.
    assert_eq!(t.locality(&["nosuch", "neither"]), None);
}

#[test]
fn the_nearest_device_comes_first() {
    let t = two_sockets();
    let devices = [
        candidate("mlx5_0", &["ib0"]),
        candidate("mlx5_1", &["ib1"]),
        candidate("rxe0", &[]),
    ];
    let on = |cpus: &[u32]| {
        t.rank(&devices, &IndexSet::new(cpus.iter().copied()))
            .into_iter()
            .map(|c| (c.device, c.nearness))
            .collect::<Vec<_>>()
    };
    // On socket 1, mlx5_1 is local; mlx5_0 remote; rxe0 unknown.
    assert_eq!(
        on(&[3]),
        [
            ("mlx5_1".to_string(), Nearness::Local),
            ("mlx5_0".to_string(), Nearness::Remote),
            ("rxe0".to_string(), Nearness::Unknown),
        ]
    );
    assert_eq!(on(&[0, 1])[0], ("mlx5_0".to_string(), Nearness::Local));
    // Spread over both sockets with more CPUs on socket 1.
    assert_eq!(on(&[1, 2, 3])[0], ("mlx5_1".to_string(), Nearness::Partial));
    // Evenly spread: the order given decides.
    assert_eq!(on(&[0, 1, 2, 3])[0].0, "mlx5_0");
}

#[test]
fn nothing_is_bound_on_a_described_machine() {
    let t = two_sockets();
    assert!(t.process_cpus().is_none());
    assert!(t.bind_thread(&IndexSet::new([0])).is_err());
}

#[test]
fn this_machine_loads_and_binds_a_thread() {
    let t = Topo::this_system().unwrap_or_else(|| panic!("{:?}", Topo::load_error()));
    assert!(t.is_this_system());
    let all = t.cpus();
    assert!(!all.is_empty());
    let mine = t.process_cpus().expect("a binding");
    assert!(all.includes(&mine));
    assert!(!t.running_on().expect("a CPU").is_empty());
    let first = IndexSet::new([mine.as_slice()[0]]);
    std::thread::scope(|s| {
        s.spawn(|| {
            t.bind_thread(&first).expect("bind");
            assert_eq!(t.thread_cpus().unwrap(), first);
        });
    });
    // The calling thread kept its own binding.
    assert_eq!(t.thread_cpus().unwrap(), mine);
}
