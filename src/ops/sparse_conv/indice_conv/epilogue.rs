//! IndiceConv's fused epilogue on the CPU: scale, shift, residual and activation over an
//! output block still in cache, in the unfused graph's order and rounding.

use super::Activation;

/// The epilogue's inputs and activation (schemas/sparse_conv/indice_conv.json).
#[derive(Clone, Copy)]
pub(super) struct Epilogue<'a> {
    pub(super) scale: Option<&'a [f32]>,
    pub(super) shift: Option<&'a [f32]>,
    /// The whole [num_out, Cout] input.
    pub(super) residual: Option<&'a [f32]>,
    pub(super) activation: Activation,
}

impl Epilogue<'_> {
    /// y = act(y * scale + shift + residual) over a block of whole output rows starting at
    /// output element `at`: each step one float32 operation (no fused multiply-add), as the
    /// unfused Mul, Add, Add and Relu compute it; one row at a time, the row in L1.
    pub(super) fn apply(&self, block: &mut [f32], cout: usize, at: usize) {
        if self.scale.is_none()
            && self.shift.is_none()
            && self.residual.is_none()
            && self.activation == Activation::None
        {
            return; // the plain convolution, untouched
        }
        let residual = self.residual.map(|r| &r[at..at + block.len()]);
        for (o, row) in block.chunks_exact_mut(cout.max(1)).enumerate() {
            if let Some(scale) = self.scale {
                row.iter_mut().zip(scale).for_each(|(y, &s)| *y *= s);
            }
            if let Some(shift) = self.shift {
                row.iter_mut().zip(shift).for_each(|(y, &s)| *y += s);
            }
            if let Some(residual) = residual {
                let r = &residual[o * cout..(o + 1) * cout];
                row.iter_mut().zip(r).for_each(|(y, &r)| *y += r);
            }
            if self.activation == Activation::Relu {
                // `if y < 0`, not max: NaN and -0 pass unchanged, as in ONNX Runtime's Relu.
                row.iter_mut().for_each(|y| *y = if *y < 0.0 { 0.0 } else { *y });
            }
        }
    }
}
