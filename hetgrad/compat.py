"""The one place that knows which TensorFlow/Keras flavour runs.

Flavours: ``keras2`` (TF <= 2.15, Keras 2 as ``tf.keras``), ``tf_keras`` (TF >= 2.16 with
``TF_USE_LEGACY_KERAS=1``: the Keras 2 API from the ``tf-keras`` package) and ``keras3``
(TF >= 2.16, ``tf.keras`` is Keras 3). Everything else in hetgrad imports ``keras`` from here
and asks the helpers below instead of testing versions or classes itself.
"""
from __future__ import annotations

import contextlib
import importlib

import tensorflow as tf

from .errors import ConfigError

keras = tf.keras
# tf.keras is a lazy module inside the package that provides it: keras or tf_keras
KERAS_VERSION: str = importlib.import_module(keras.__name__.split(".")[0]).__version__
KERAS3: bool = int(KERAS_VERSION.split(".")[0]) >= 3
TF_VERSION: str = tf.__version__
FLAVOUR: str = "keras3" if KERAS3 else (
    "tf_keras" if tuple(int(p) for p in TF_VERSION.split(".")[:2]) >= (2, 16) else "keras2")


def optimizer_kind(optimizer) -> str:
    """``keras3``, ``keras2`` (Keras 2.11+ optimizers) or ``legacy`` (Keras 2's OptimizerV2)
    for a Keras optimizer object, judged by its class, so a Keras 3 optimizer is known as one
    even beside tf-keras; anything else is refused (it would never aggregate)."""
    keras_pkg = importlib.import_module("keras")
    if (int(keras_pkg.__version__.split(".")[0]) >= 3
            and isinstance(optimizer, keras_pkg.optimizers.Optimizer)):
        return "keras3"
    if not KERAS3:
        legacy = getattr(keras.optimizers, "legacy", None)
        if legacy is not None and isinstance(optimizer, legacy.Optimizer):
            return "legacy"
        if isinstance(optimizer, keras.optimizers.Optimizer):
            return "keras2"
    kind = type(optimizer)
    raise ConfigError(f"hetgrad's DistributedOptimizer needs a Keras optimizer of TF "
                      f"{TF_VERSION} (tf.keras is Keras {KERAS_VERSION}), got "
                      f"{kind.__module__}.{kind.__qualname__}", field="optimizer")


def is_loss_scale_optimizer(optimizer) -> bool:
    """A mixed-precision ``LossScaleOptimizer`` (it skips non-finite steps itself)."""
    classes = (getattr(keras.optimizers, "LossScaleOptimizer", None),
               getattr(getattr(keras, "mixed_precision", None), "LossScaleOptimizer", None))
    return any(c is not None and isinstance(optimizer, c) for c in classes)


def is_sgd(optimizer) -> bool:
    """Whether ``optimizer`` (or what it wraps) is an SGD of any Keras flavour."""
    return any(c.__name__ == "SGD" for c in type(optimizer).__mro__)


def mixed_float16() -> bool:
    """Whether the global dtype policy is ``mixed_float16`` (Keras wraps the optimizer in a
    ``LossScaleOptimizer`` at ``compile`` then)."""
    return keras.mixed_precision.global_policy().name == "mixed_float16"


def loss_scale_optimizer(inner, like=None):
    """A dynamic ``LossScaleOptimizer`` around ``inner``, with the settings of ``like`` (another
    one) if given."""
    if KERAS3:
        kw = {} if like is None else dict(initial_scale=like.initial_scale,
                                          dynamic_growth_steps=like.dynamic_growth_steps)
        return keras.optimizers.LossScaleOptimizer(inner, **kw)
    kw = {} if like is None else dict(dynamic=like.dynamic, initial_scale=like.initial_scale,
                                      dynamic_growth_steps=like.dynamic_growth_steps)
    return keras.mixed_precision.LossScaleOptimizer(inner, **kw)


def inner_optimizer(loss_scale_opt):
    """The optimizer a ``LossScaleOptimizer`` wraps."""
    return loss_scale_opt.inner_optimizer


def tf_variables(variables) -> list[tf.Variable]:
    """The ``tf.Variable`` behind each Keras variable (Keras 3 wraps them)."""
    if not KERAS3:
        return list(variables)
    return [v if isinstance(v, tf.Variable) else v.value for v in variables]


def variable_key(variable) -> int:
    """The same number for a Keras variable and the ``tf.Variable`` behind it (sets of
    local variables, whichever of the two the user holds)."""
    return id(tf_variables([variable])[0])


def build_optimizer(optimizer, variables) -> None:
    """Create an optimizer's slot variables now (Keras 2.11+/3: ``build``; OptimizerV2:
    ``_create_all_weights``); a no-op once built."""
    kind = optimizer_kind(optimizer)
    if kind == "legacy":
        optimizer._create_all_weights(list(variables))
    elif kind == "keras2":  # idempotent
        optimizer.build(list(variables))
    elif not optimizer.built:
        optimizer.build(list(variables))
        optimizer.built = True


def optimizer_built(optimizer) -> bool:
    """Whether a Keras 3 or 2.11+ optimizer's slots exist (an OptimizerV2 does not say)."""
    return bool(getattr(optimizer, "built", False) or getattr(optimizer, "_built", False))


def build_for_fit(model, element_spec) -> None:
    """Create what a compiled ``model``'s first training step would (the optimizer's slots,
    the compiled metrics; Keras 3: the layers' and the loss's state too) from the shapes of
    batches ``element_spec`` (``(x, y[, w])``): Keras creates them inside the first traced
    step, and a ``tf.function`` that creates variables is traced twice. Only an optimization,
    left to the step where a custom ``train_step`` may change what the model sees, where a
    Keras 2 model has several outputs or labels, and where building raises."""
    if model.built:
        build_optimizer(model.optimizer, model.trainable_variables)
    if type(model).train_step is not keras.Model.train_step:
        return
    try:
        if KERAS3:
            model._symbolic_build(data_batch=element_spec)
        elif len(getattr(model, "outputs", None) or ()) == 1 and isinstance(
                element_spec[1], tf.TensorSpec) and not model.compiled_metrics.built:
            # (a metric is chosen by the output's and the labels' shapes)
            model.compiled_metrics.build(model.outputs[0], element_spec[1])
    except Exception:   # (the user's model code: whatever it raises, Keras builds later)
        pass


def is_compiled(model) -> bool:
    return bool(getattr(model, "compiled", False) or getattr(model, "_is_compiled", False))


def recompile(model, optimizer) -> None:
    """Compile ``model`` again as its last ``compile`` did (loss, metrics, ...), with
    ``optimizer`` instead (every flavour keeps those arguments in ``_compile_config``)."""
    config = getattr(model, "_compile_config", None)
    if not is_compiled(model) or config is None:
        raise ConfigError("compile the model (optimizer and loss) first", field="model")
    model.compile(**{**dict(config.config), "optimizer": optimizer})


def steps_per_execution(model) -> int:
    """Train steps per call into the graph (``compile(steps_per_execution=)``; Keras 2 keeps
    it in a variable), 1 before ``compile``."""
    k = getattr(model, "steps_per_execution", None)
    return int(k.numpy()) if hasattr(k, "numpy") else int(k or 1)


def progbar_logger():
    """Keras' progress bar counting steps (Keras 2's counts samples by default, which a TF2
    ``fit`` does not report: its bar would not move)."""
    cb = keras.callbacks
    return cb.ProgbarLogger() if KERAS3 else cb.ProgbarLogger(count_mode="steps")


@contextlib.contextmanager
def one_step_per_call(model):
    """Within: ``train_on_batch`` runs one step although ``model`` was compiled with several per
    call (Keras 2's multi-step function would ask its one-batch iterator for more)."""
    k = steps_per_execution(model)
    if k == 1:
        yield model
        return
    model.steps_per_execution, model.train_function = 1, None  # (Keras 2: assigns its variable)
    try:
        yield model
    finally:
        model.steps_per_execution, model.train_function = k, None


def optimizer_variables(optimizer) -> list:
    """Every variable of an optimizer (iterations, slots): a property or a method by flavour."""
    v = optimizer.variables
    return list(v() if callable(v) else v)


def adam_preconditioner(optimizer) -> "AdamScales | None":
    """For an Adam or AdamW of any flavour its :class:`AdamScales`; None for any other
    optimizer, and for AMSGrad (it divides by the largest ``v`` seen)."""
    if (not any(c.__name__ in ("Adam", "AdamW") for c in type(optimizer).__mro__)
            or getattr(optimizer, "amsgrad", False)):
        return None
    return AdamScales(optimizer)


class AdamScales:
    """Adam's per-entry step per unit (bias-corrected) first moment in the step that applies
    a (dense) gradient ``g``: ``sqrt(1 - beta_2^t) / (sqrt(v) + eps)``, ``v`` the second moment
    with ``g`` taken in (Keras adds ``eps`` before the bias correction). Its slots must exist."""

    def __init__(self, optimizer):
        self.optimizer, self.kind = optimizer, optimizer_kind(optimizer)

    def moment(self, variable) -> tf.Tensor:
        """``variable``'s second moment ``v`` before this step (float32)."""
        opt = self.optimizer
        if self.kind == "legacy":
            v = opt.get_slot(variable, "v")
        else:
            v = opt._velocities[opt._index_dict[opt._var_key(variable)] if self.kind == "keras2"
                                else opt._get_variable_index(variable)]
        return tf.cast(v, tf.float32)

    def __call__(self, moments: list, grads: list) -> list:
        """The scales for ``grads`` given their variables' ``moments`` (or the same entries
        of both: a block of each)."""
        opt = self.optimizer
        beta_2 = tf.cast(opt._get_hyper("beta_2") if self.kind == "legacy" else opt.beta_2,
                         tf.float32)
        corrected = tf.sqrt(1.0 - tf.pow(beta_2, tf.cast(opt.iterations, tf.float32) + 1.0))
        return [corrected / (tf.sqrt(beta_2 * v + (1.0 - beta_2) * g * g) + opt.epsilon)
                for v, g in zip(moments, grads)]


def learning_rate(optimizer) -> float:
    """The current learning rate (a schedule object evaluated at the optimizer's step)."""
    lr = optimizer.learning_rate
    if callable(lr) and not hasattr(lr, "numpy"):
        lr = lr(optimizer.iterations)
    return float(tf.convert_to_tensor(lr))


def has_schedule(optimizer) -> bool:
    """Whether the learning rate is a schedule object (Keras 2's optimizers show it as a
    variable the schedule overwrites every step)."""
    schedule = keras.optimizers.schedules.LearningRateSchedule
    held = getattr(optimizer, "_learning_rate", None)
    lr = optimizer.learning_rate
    return isinstance(held, schedule) or isinstance(lr, schedule) or not hasattr(lr, "assign")


def set_learning_rate(optimizer, value: float) -> None:
    """Set a constant learning rate (a schedule object cannot be set)."""
    lr = optimizer.learning_rate
    if not hasattr(lr, "assign"):
        raise ValueError("the optimizer's learning rate is a schedule, not a variable")
    lr.assign(value)
