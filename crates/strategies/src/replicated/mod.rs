//! The strategies whose ranks all hold every parameter: one
//! [`Replicated`](crate::Replicated) type over how gradients are reduced
//! ([`SingleDevice`](crate::SingleDevice), [`Ddp`](crate::Ddp), [`Zero`](crate::Zero)
//! stages 1 and 2), a rank's part of them once its parameters exist, the state they share, and the bucketed reductions issued during
//! backward.

pub(crate) mod bucket_reduce;
pub(crate) mod ddp;
pub(crate) mod frozen_param;
pub(crate) mod grad_reduce;
pub(crate) mod replicated_rank;
pub(crate) mod replicated_state;
pub(crate) mod replicated_strategy;
pub(crate) mod single;
pub(crate) mod zero;
