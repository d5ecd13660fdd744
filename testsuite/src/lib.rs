//! The workspace's integration tests and their shared sagas; the library is
//! `saga-runtime`. The code blocks of the README and of the guide
//! (`guide/*.md`) are compiled and run as doctests from here.

#[doc(hidden)]
pub mod batch;
#[doc(hidden)]
pub mod chaos;
#[doc(hidden)]
pub mod crashy;
#[doc(hidden)]
pub mod double;
#[doc(hidden)]
pub mod shop;
#[doc(hidden)]
pub mod worker_env;

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/README.md")]
pub struct GuideContentsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/01-step-sagas.md")]
pub struct GuideStepSagasDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/02-process-managers.md")]
pub struct GuideProcessManagersDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/03-stores.md")]
pub struct GuideStoresDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/04-talking-to-other-services.md")]
pub struct GuideTalkingToOtherServicesDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/05-operating.md")]
pub struct GuideOperatingDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/06-testing-under-faults.md")]
pub struct GuideTestingUnderFaultsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/07-guarantees-and-limits.md")]
pub struct GuideGuaranteesAndLimitsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/08-versions-and-upgrades.md")]
pub struct GuideVersionsAndUpgradesDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../guide/09-layout.md")]
pub struct GuideLayoutDoctests;
