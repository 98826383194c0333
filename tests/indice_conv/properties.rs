//! Property tests over random rulebooks.

use super::*;

fn any_conv() -> impl Strategy<Value = (Conv, bool)> {
    (0usize..4, 0usize..5, 0usize..5, 0usize..5, 0usize..3, 0usize..3, any::<bool>(), any::<bool>())
        .prop_flat_map(|(k, p, l, num_out, cin, cout, inverse, bias)| {
            let (src_limit, dst_limit) = (l as i32, num_out as i32);
            let index = |limit: i32| {
                prop_oneof![
                    30 => 0..limit.max(1),
                    2 => -3..limit + 3,
                    1 => Just(i32::MIN),
                    1 => Just(i32::MAX),
                ]
            };
            // Slot 0 holds sources unless inverse, then destinations.
            let (slot0, slot1) = if inverse { (dst_limit, src_limit) } else { (src_limit, dst_limit) };
            let pi = p as i32;
            let num = prop_oneof![20 => 0..=pi, 1 => -2..pi + 3, 1 => Just(i32::MIN), 1 => Just(i32::MAX)];
            (
                Just((k, p, l, num_out, cin, cout, inverse, bias)),
                prop::collection::vec(index(slot0), k * p),
                prop::collection::vec(index(slot1), k * p),
                prop::collection::vec(num, k),
                any::<u64>(),
            )
        })
        .prop_map(|((k, p, l, num_out, cin, cout, inverse, bias), s0, s1, num, seed)| {
            let mut rng = Rng(seed);
            let mut pairs = Vec::with_capacity(k * 2 * p);
            for kk in 0..k {
                pairs.extend_from_slice(&s0[kk * p..(kk + 1) * p]);
                pairs.extend_from_slice(&s1[kk * p..(kk + 1) * p]);
            }
            let conv = Conv {
                l,
                cin,
                cout,
                k,
                p,
                num_out,
                features: rng.floats(l * cin),
                filters: rng.floats(k * cin * cout),
                pairs,
                num,
                out_indices: vec![-1; num_out * 2],
                out_d: 2,
                bias: bias.then(|| rng.floats(cout)),
            };
            (conv, inverse)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Random indice_pairs / indice_num (out-of-range values, indice_num > P or < 0), both
    /// directions: never a panic; an error naming the offending tensor exactly when the
    /// contract says; otherwise the reference, bit-identical between Serial and Threads(2).
    #[test]
    fn random_rulebooks_follow_the_contract((conv, inverse) in any_conv()) {
        let (num_bad, pair_bad) = index_errors(&conv, inverse);
        match conv.run(inverse as i64, &Threads(2)) {
            Ok(got) => {
                prop_assert!(!num_bad && !pair_bad, "accepted an invalid rulebook: {:?}", conv);
                // A few random terms can cancel to almost nothing: each element is judged
                // against the magnitude of its own terms (docs/CONTRACT.md 1.5).
                let want = reference(&conv, inverse);
                let terms = reference(&conv.magnitudes(), inverse);
                if let Err(e) = judge_against_terms(&got, &want, &terms, ELEM_REL) {
                    prop_assert!(false, "output {}", e);
                }
                let serial = conv.run(inverse as i64, &Serial).expect("runs");
                prop_assert_eq!(bits(&serial), bits(&got));
            }
            Err(e) => {
                let msg = format!("{e}");
                prop_assert!(num_bad || pair_bad, "rejected a valid rulebook: {}", msg);
                let names_num = msg.contains("'indice_num'");
                let names_pairs = msg.contains("'indice_pairs'");
                match (num_bad, pair_bad) {
                    (true, false) => prop_assert!(names_num, "{}", msg),
                    (false, true) => prop_assert!(names_pairs, "{}", msg),
                    _ => prop_assert!(names_num || names_pairs, "{}", msg),
                }
            }
        }
    }
}
