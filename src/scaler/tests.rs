//! The scaler's arithmetic against PyTorch's, and its bounds.

#[cfg(test)]
mod arithmetic {
    use crate::scaler::*;

    #[test]
    fn defaults_are_pytorchs() {
        let s = GradScaler::default().state();
        assert_eq!(
            (
                s.scale,
                s.growth_factor,
                s.backoff_factor,
                s.growth_interval
            ),
            (65536.0, 2.0, 0.5, 2000)
        );
        assert_eq!(s.mode, ScaleMode::Dynamic);
    }

    #[test]
    fn invalid_settings_are_rejected() {
        assert!(GradScaler::new(0.0, 2.0, 0.5, 10).is_err());
        assert!(GradScaler::new(f32::INFINITY, 2.0, 0.5, 10).is_err());
        assert!(GradScaler::new(1.0, 1.0, 0.5, 10).is_err());
        assert!(GradScaler::new(1.0, 2.0, 1.0, 10).is_err());
        assert!(GradScaler::new(1.0, 2.0, 0.5, 0).is_err());
        assert!(GradScaler::with_static_scale(-1.0).is_err());
    }

    #[test]
    fn growth_stops_before_overflowing_fp32() {
        let mut scaler = GradScaler::new(f32::MAX / 1.5, 2.0, 0.5, 1).unwrap();
        scaler.record(false).unwrap();
        assert_eq!(scaler.get_scale(), f32::MAX / 1.5);
        assert_eq!(scaler.growth_tracker(), 0);
    }

    #[test]
    fn static_and_disabled_scales_never_change() {
        let mut fixed = GradScaler::with_static_scale(128.0).unwrap();
        let mut off = GradScaler::disabled();
        for found_inf in [true, false, false, true] {
            fixed.record(found_inf).unwrap();
            off.record(found_inf).unwrap();
        }
        assert_eq!((fixed.get_scale(), fixed.skipped_steps()), (128.0, 2));
        assert_eq!((off.get_scale(), off.skipped_steps()), (1.0, 0));
        assert!(!off.is_enabled());
    }

    #[test]
    fn state_round_trips_and_bad_state_is_refused() {
        let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 5).unwrap();
        scaler.record(false).unwrap();
        scaler.record(true).unwrap();
        scaler.record(false).unwrap();
        let saved = scaler.state();
        let mut restored = GradScaler::dynamic();
        restored.load_state(saved).unwrap();
        assert_eq!(restored, scaler);

        let mut bad = saved;
        bad.growth_tracker = 5;
        assert!(restored.load_state(bad).is_err());
        bad = saved;
        bad.scale = f32::NAN;
        assert!(restored.load_state(bad).is_err());
        assert_eq!(
            restored, scaler,
            "a failed load leaves the scaler unchanged"
        );
    }
}

#[cfg(test)]
mod bounds {
    use crate::error::AmpError;
    use crate::scaler::*;

    #[test]
    fn the_ceiling_caps_growth_and_the_floor_caps_backoff() {
        let mut scaler = GradScaler::new(4.0, 2.0, 0.5, 1)
            .unwrap()
            .with_max_scale(8.0)
            .unwrap()
            .with_min_scale(2.0)
            .unwrap();
        for _ in 0..3 {
            scaler.record(false).unwrap();
        }
        assert_eq!(scaler.get_scale(), 8.0);
        scaler.record(true).unwrap();
        scaler.record(true).unwrap();
        assert_eq!(scaler.get_scale(), 2.0);
    }

    #[test]
    fn a_scale_stuck_at_its_floor_is_an_error() {
        let mut scaler = GradScaler::new(2.0, 2.0, 0.5, 100)
            .unwrap()
            .with_min_scale(1.0)
            .unwrap()
            .with_floor_patience(3)
            .unwrap();
        scaler.record(true).unwrap(); // 2 -> 1: reaches the floor
        scaler.record(true).unwrap(); // at the floor: 1
        scaler.record(true).unwrap(); // 2
        let err = scaler.record(true).unwrap_err(); // 3 in a row
        assert!(
            matches!(err, AmpError::ScaleFloor { steps: 3, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("floor"));
        // A clean step resets the count.
        scaler.record(false).unwrap();
        scaler.record(true).unwrap();
        assert_eq!(scaler.skipped_steps(), 5);
    }

    #[test]
    fn pytorch_defaults_have_no_bounds() {
        let mut scaler = GradScaler::new(1.0, 2.0, 0.5, 1).unwrap();
        for _ in 0..200 {
            scaler.record(true).unwrap();
        }
        assert!(scaler.get_scale() < 1e-30, "PyTorch's scale keeps halving");
    }
}
