//! PLACEHOLDER (to be replaced by the operator implementation before any commit).
use crate::error::{Error, Result};
use crate::parallel::Parallel;
use crate::schema::Attrs;
use crate::tensor::{Inputs, OutputSpec, Outputs};

pub struct PsRoiPoolBackward;

impl super::Operator for PsRoiPoolBackward {
    const NAME: &'static str = "PsRoiPoolBackward";
    type Plan = ();
    fn from_attributes(_attrs: &Attrs<'_>) -> Result<Self> {
        Err(Error::Runtime("placeholder".into()))
    }
    fn plan(&self, _inputs: &Inputs<'_>) -> Result<(Vec<OutputSpec>, ())> {
        Err(Error::Runtime("placeholder".into()))
    }
    fn execute(&self, _p: (), _i: &Inputs<'_>, _o: &mut Outputs<'_>, _par: &dyn Parallel) -> Result<()> {
        Err(Error::Runtime("placeholder".into()))
    }
}
