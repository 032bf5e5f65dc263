//! The x86-64 instruction sets this crate's CPU kernels are compiled for, and the one this
//! CPU runs, picked at run time.

/// The versions of a kernel the build holds, widest first. A default x86-64 build has SSE2
/// only. The kernels enable no FMA, so that each multiply and add rounds on its own and
/// every version gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
    Baseline,
}

impl Isa {
    pub(crate) const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Baseline];

    /// Whether this CPU has the instructions of the version.
    pub(crate) fn runs_here(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            Isa::Baseline => true,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest version this CPU runs.
    pub(crate) fn widest() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.runs_here())
            .unwrap_or(Isa::Baseline)
    }
}

/// Defines `fn $name(isa: Isa, args..) [-> ret]`, which runs `$body(args..)` (an
/// `#[inline(always)]` function) compiled for `isa`'s instructions, or the baseline's where
/// this CPU lacks them.
macro_rules! in_each_isa {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $body:ident) => {
        $(#[$meta])*
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
        fn $name(isa: $crate::isa::Isa, $($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::isa::Isa;
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                if isa.runs_here() {
                    match isa {
                        // SAFETY: the CPU has the instructions this version was compiled for.
                        Isa::Avx512 => return unsafe { avx512($($arg),*) },
                        // SAFETY: as above.
                        Isa::Avx2 => return unsafe { avx2($($arg),*) },
                        Isa::Baseline => {}
                    }
                }
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use in_each_isa;
