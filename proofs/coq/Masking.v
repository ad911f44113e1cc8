(* Masking is exact in IEEE binary32: naive decode's masked columns change no bit.

   Naive decode computes attention for all T rows at once: every score, the columns after a
   row's position set to -inf, a softmax over the whole row, then P V over every row. Cached
   decode's row reads only positions 0..t. In real numbers the masked columns contribute 0; in
   float32 this file proves they contribute exactly nothing, with Flocq's binary32 (Bits.v:
   24-bit significand, emax 128, NaN payloads as IEEE 754) and round to nearest, ties to even:

   - add_neg_zero: if x + y rounds to -0 then x and y are both -0; so a sum that starts at +0
     never becomes -0 (fold_add_not_neg_zero).
   - add_zero_right: s + (+-0) = s for every s but -0 (in particular +0 + (+-0) = +0).
   - masked_fold: after any terms, any number of +0 * v terms (v finite) leave a product's sum
     unchanged, bit for bit: the masked columns of P V.
   - row_max_masked, exp_sum_masked, exp_sum_at_least_one, softmax_masked: -inf scores never
     become the row maximum, their exponentials are +0 and leave the sum unchanged, the sum is
     at least 1 (so the masked probabilities are +0 / sum = +0, never 0 / 0), and the masked
     row's softmax is the prefix's followed by exact +0s.
   - causal_row_is_cached_row: naive decode's row t (masked, over T rows) is cached decode's
     row over positions 0..t.
   - naive_equals_cached_f32: combined with causal reuse (CausalReuse.v) for a multi-head
     float32 decoder stack with arbitrary row-wise maps: naive decode's last row equals cached
     decode's, bit for bit.

   The arithmetic is modelled as the C++ runs it (core/kernels.cpp softmax and attention_row,
   core/cpu_backend.cpp causal_attention, matmul's k-ascending sums from +0; gpu/kernels.h runs
   the same order). Hypotheses, each checked by a test named in proofs/README.md:
   - exp_f32 (core/numerics.h) maps -inf to +0 and +0 to 1, and every non-NaN x <= 0 other than
     +inf (so -inf, -0, +0 and every negative float) to a finite float with its sign bit clear:
     exp_of_neg_inf_is_zero, exp_of_zero_is_one, exp_nonpositive_is_nonnegative;
   - the data: the scores of positions 0..t and the V rows are finite (run_finite). An inf or
     NaN there is a bug kvlab wants to see, and 0 * inf = NaN would show it;
   - both paths use the same kernels, so the same fold (CausalReuse.same_fold_order, true here
     by construction: attention_row is the one function of both paths). *)
(* main: add_neg_zero add_zero_right masked_fold row_max_masked exp_sum_masked exp_sum_at_least_one softmax_masked causal_row_is_cached_row naive_equals_cached_f32 *)

From Coq Require Import List Arith Lia Reals Lra Bool ZArith.
From Flocq Require Import Core IEEE754.Binary IEEE754.Bits.
From Flocq.Prop Require Import Plus_error.
From Kvlab Require Import CausalReuse.
Import ListNotations.

Definition f32 := binary32.
Definition add (x y : f32) : f32 := b32_plus BinarySingleNaN.mode_NE x y.
Definition sub (x y : f32) : f32 := b32_minus BinarySingleNaN.mode_NE x y.
Definition mul (x y : f32) : f32 := b32_mult BinarySingleNaN.mode_NE x y.
Definition div (x y : f32) : f32 := b32_div BinarySingleNaN.mode_NE x y.
Definition pos_zero : f32 := B754_zero 24 128 false.
Definition neg_zero : f32 := B754_zero 24 128 true.
Definition neg_inf : f32 := B754_infinity 24 128 true.
Definition pos_inf : f32 := B754_infinity 24 128 false.
Definition finite (x : f32) : Prop := is_finite 24 128 x = true.
Definition real (x : f32) : R := B2R 24 128 x.
Definition sign (x : f32) : bool := Bsign 24 128 x.

Lemma B2FF_inf : forall (x : f32) s, B2FF 24 128 x = F754_infinity s -> x = B754_infinity 24 128 s.
Proof. intros [s0|s0|s0 pl0 H0|s0 m0 e0 H0] s H; simpl in H; try discriminate; now inversion H. Qed.

Lemma overflow_NE : forall s, binary_overflow 24 128 BinarySingleNaN.mode_NE s = F754_infinity s.
Proof. intros []; reflexivity. Qed.

Lemma sign_true_neg : forall x : f32, finite x -> sign x = true -> (real x <= 0)%R.
Proof.
  intros [s|s|s pl H|s m e H] Hf Hs; unfold real, sign in *; simpl in *; try discriminate; try lra.
  subst s. apply Rlt_le. apply F2R_lt_0. simpl. lia.
Qed.

Lemma sign_false_pos : forall x : f32, finite x -> sign x = false -> (0 <= real x)%R.
Proof.
  intros [s|s|s pl H|s m e H] Hf Hs; unfold real, sign in *; simpl in *; try discriminate; try lra.
  subst s. apply F2R_ge_0. simpl. lia.
Qed.

Lemma sign_true_finite_nonzero : forall x : f32, finite x -> sign x = true -> x <> neg_zero -> (real x < 0)%R.
Proof.
  intros [s|s|s pl H|s m e H] Hf Hs Hz; unfold real, sign in *; simpl in *; try discriminate.
  - subst s. now elim Hz.
  - subst s. apply F2R_lt_0. simpl. lia.
Qed.

Lemma neg_zero_or_negative : forall x : f32, finite x -> sign x = true -> x = neg_zero \/ (real x < 0)%R.
Proof.
  intros [s|s|s pl H|s m e H] Hf Hs; unfold real, sign in *; simpl in *; try discriminate.
  - subst s. now left.
  - subst s. right. apply F2R_lt_0. simpl. lia.
Qed.

Lemma format_real : forall x : f32, generic_format radix2 (SpecFloat.fexp 24 128) (real x).
Proof. intros x. apply generic_format_B2R. Qed.

Global Instance valid_exp_f32 : Valid_exp (SpecFloat.fexp 24 128) := fexp_correct 24 128 eq_refl.
Global Instance monotone_exp_f32 : Monotone_exp (SpecFloat.fexp 24 128) := fexp_monotone 24 128.

(* x + y rounds to -0 only when both are -0. *)
Theorem add_neg_zero : forall x y, add x y = neg_zero -> x = neg_zero /\ y = neg_zero.
Proof.
  intros x y H.
  destruct (is_finite 24 128 x) eqn:Fx; [destruct (is_finite 24 128 y) eqn:Fy |].
  - pose proof (Bplus_correct 24 128 eq_refl eq_refl binop_nan_pl32 BinarySingleNaN.mode_NE x y Fx Fy) as C.
    unfold add, b32_plus in H. cbv zeta in H. rewrite H in C.
    destruct Rlt_bool.
    + destruct C as [C1 [_ C3]]. simpl in C1, C3.
      revert C1 C3. case Rcompare_spec; intros Hc C1 C3.
      * exfalso. revert C1. apply not_eq_sym.
        apply round_plus_neq_0; try apply generic_format_B2R; auto with typeclass_instances.
        all: try lra. all: try (apply monotone_exp_not_FTZ; auto with typeclass_instances).
      * symmetry in C3. apply andb_true_iff in C3. destruct C3 as [Sx Sy].
        destruct (neg_zero_or_negative x Fx Sx) as [Zx | Nx];
        destruct (neg_zero_or_negative y Fy Sy) as [Zy | Ny]; auto; exfalso;
        [ pose proof (sign_true_neg x Fx Sx) | pose proof (sign_true_neg y Fy Sy) | ];
        unfold real in *; lra.
      * discriminate.
    + destruct C as [C _]. rewrite overflow_NE in C. discriminate.
  - destruct x as [sx|sx|sx plx Hx|sx mx ex Hx], y as [sy|sy|sy ply Hy|sy my ey Hy];
      try discriminate; destruct sx; try destruct sy; discriminate.
  - destruct x as [sx|sx|sx plx Hx|sx mx ex Hx], y as [sy|sy|sy ply Hy|sy my ey Hy];
      try discriminate; destruct sx; try destruct sy; discriminate.
Qed.

Definition is_zero (z : f32) : Prop := z = pos_zero \/ z = neg_zero.

(* s + (+-0) = s for every s but -0: finite, infinite or NaN (its payload is kept). With s = +0
   this is +0 + (+-0) = +0. *)
Theorem add_zero_right : forall s z, s <> neg_zero -> is_zero z -> add s z = s.
Proof.
  intros s z Hs [Hz | Hz]; subst z;
    destruct s as [ss|ss|ss pl Hpl|ss ms es Hes]; try destruct ss; try reflexivity;
    now elim Hs.
Qed.

(* An accumulator that is not -0 never becomes -0. *)
Lemma fold_add_not_neg_zero : forall l acc, acc <> neg_zero -> fold_left add l acc <> neg_zero.
Proof.
  induction l as [| x l IH]; intros acc Hacc; simpl; auto.
  apply IH. intros H. apply add_neg_zero in H. tauto.
Qed.

Lemma fold_add_zeros : forall zs acc, acc <> neg_zero -> Forall is_zero zs -> fold_left add zs acc = acc.
Proof.
  induction zs as [| z zs IH]; intros acc Hacc Hzs; simpl; auto.
  inversion Hzs; subst. rewrite add_zero_right by auto. auto.
Qed.

Lemma mul_zero_finite : forall v, finite v -> is_zero (mul pos_zero v).
Proof.
  intros [s|s|s pl Hpl|s m e He] Hv; try discriminate; destruct s; unfold is_zero;
    (left; reflexivity) || (right; reflexivity).
Qed.

(* One output of a product: ((+0 + p0 v0) + p1 v1) + ..., as matmul and attention sum. *)
Definition mac (acc : f32) (pv : f32 * f32) : f32 := add acc (mul (fst pv) (snd pv)).

Lemma fold_mac_not_neg_zero : forall l acc, acc <> neg_zero -> fold_left mac l acc <> neg_zero.
Proof.
  induction l as [| x l IH]; intros acc Hacc; simpl; auto.
  apply IH. intros H. apply add_neg_zero in H. tauto.
Qed.

(* The masked columns of a product change nothing: after any terms, any number of +0 * v
   terms with v finite leave the sum as it was, bit for bit. *)
Theorem masked_fold : forall terms vs,
  Forall finite vs ->
  fold_left mac (terms ++ map (pair pos_zero) vs) pos_zero = fold_left mac terms pos_zero.
Proof.
  intros terms vs Hvs. rewrite fold_left_app.
  assert (Hacc : fold_left mac terms pos_zero <> neg_zero)
    by (apply fold_mac_not_neg_zero; discriminate).
  generalize dependent (fold_left mac terms pos_zero). intros acc Hacc.
  induction vs as [| v vs IH]; simpl; auto.
  inversion Hvs; subst. unfold mac at 2. simpl.
  rewrite add_zero_right by (auto using mul_zero_finite). auto.
Qed.

(* ---- The softmax, as kernels.cpp computes it. *)

Definition one : f32 := Bone 24 128 eq_refl eq_refl.
Lemma real_one : real one = 1%R.
Proof. apply Bone_correct. Qed.

(* x > m, as C++ compares floats: false when either is NaN. *)
Definition gt (x m : f32) : bool :=
  match Bcompare 24 128 x m with Some Gt => true | _ => false end.

(* max = x0; for each later x: if (x > max) max = x. *)
Definition row_max (x0 : f32) (rest : list f32) : f32 :=
  fold_left (fun m x => if gt x m then x else m) rest x0.

Section Softmax.
  (* exp_f32 (core/numerics.h). The proofs use three of its properties, each checked by a test
     in tests/test_kernels.cpp: *)
  Variable exp : f32 -> f32.
  Definition exp_of_neg_inf_is_zero : Prop := exp neg_inf = pos_zero.
  Definition exp_of_zero_is_one : Prop := exp pos_zero = one.
  Definition exp_nonpositive_is_nonnegative : Prop := forall x,
    is_nan 24 128 x = false -> x <> pos_inf -> (real x <= 0)%R ->
    finite (exp x) /\ sign (exp x) = false.

  (* e_i = exp(x_i - max), summed from +0 in order, then p_i = e_i / sum. *)
  Definition shifted_exps (xs : list f32) : list f32 :=
    match xs with
    | [] => []
    | x0 :: rest => map (fun x => exp (sub x (row_max x0 rest))) xs
    end.
  Definition exp_sum (xs : list f32) : f32 := fold_left add (shifted_exps xs) pos_zero.
  Definition softmax (xs : list f32) : list f32 := map (fun e => div e (exp_sum xs)) (shifted_exps xs).
End Softmax.

Lemma gt_neg_inf : forall m, gt neg_inf m = false.
Proof. intros [s|s|s pl H|s mm e H]; destruct s; reflexivity. Qed.

(* Masked (-inf) scores never become the maximum. *)
Theorem row_max_masked : forall x0 rest k, row_max x0 (rest ++ repeat neg_inf k) = row_max x0 rest.
Proof.
  intros x0 rest k. unfold row_max. rewrite fold_left_app.
  generalize (fold_left (fun m x => if gt x m then x else m) rest x0) as m. intros m.
  induction k as [| k IH]; simpl; auto. rewrite gt_neg_inf. exact IH.
Qed.

Lemma row_max_in : forall rest x0, In (row_max x0 rest) (x0 :: rest).
Proof.
  unfold row_max. induction rest as [| y rest IH]; intros x0; simpl; auto.
  destruct (gt y x0).
  - specialize (IH y). simpl in IH. destruct IH; auto.
  - specialize (IH x0). simpl in IH. destruct IH; auto.
Qed.

Lemma gt_real : forall x m, finite x -> finite m -> gt x m = true <-> (real m < real x)%R.
Proof.
  intros x m Fx Fm. unfold gt. rewrite Bcompare_correct by assumption.
  unfold real. case Rcompare_spec; intros H; split; intros H'; try discriminate; try lra; auto.
Qed.

Lemma row_max_ge : forall rest x0, Forall finite (x0 :: rest) ->
  forall x, In x (x0 :: rest) -> (real x <= real (row_max x0 rest))%R.
Proof.
  unfold row_max. induction rest as [| y rest IH]; intros x0 Hf x Hx; simpl in *.
  - destruct Hx as [<- | []]. lra.
  - inversion Hf as [| ? ? Fx0 Hf']. inversion Hf' as [| ? ? Fy Hf'']. subst.
    set (m' := if gt y x0 then y else x0).
    assert (Fm' : finite m') by (unfold m'; destruct (gt y x0); auto).
    assert (Hm' : (real x0 <= real m')%R /\ (real y <= real m')%R).
    { unfold m'. destruct (gt y x0) eqn:G.
      - apply gt_real in G; auto. lra.
      - assert (~ (real x0 < real y)%R) by (intros H; apply gt_real in H; auto; congruence). lra. }
    assert (Hall := IH m' (Forall_cons _ Fm' Hf'')).
    assert (Hmax := Hall m' (or_introl eq_refl)).
    destruct Hx as [<- | [<- | Hx]].
    + lra.
    + lra.
    + apply Hall. now right.
Qed.

Lemma sub_neg_inf : forall m, finite m -> sub neg_inf m = neg_inf.
Proof. intros [s|s|s pl H|s mm e H] Fm; try discriminate; destruct s; reflexivity. Qed.

Lemma finite_zero : forall x : f32, finite x -> real x = 0%R -> is_zero x.
Proof.
  intros [s|s|s pl H|s m e H] Fx Hx; try discriminate.
  - destruct s; [right | left]; reflexivity.
  - exfalso. unfold real in Hx. simpl in Hx. revert Hx. apply F2R_neq_0. destruct s; simpl; lia.
Qed.

(* x - m for x <= m: not NaN, not +inf, and at most 0. *)
Lemma sub_nonpositive : forall x m, finite x -> finite m -> (real x <= real m)%R ->
  is_nan 24 128 (sub x m) = false /\ sub x m <> pos_inf /\ (real (sub x m) <= 0)%R.
Proof.
  intros x m Fx Fm Hle.
  pose proof (Bminus_correct 24 128 eq_refl eq_refl binop_nan_pl32 BinarySingleNaN.mode_NE x m Fx Fm) as C.
  unfold sub, b32_minus. cbv zeta.
  destruct Rlt_bool eqn:Hb.
  - destruct C as [C1 [C2 _]].
    assert (Hr : (real (Bminus 24 128 eq_refl eq_refl binop_nan_pl32 BinarySingleNaN.mode_NE x m) <= 0)%R).
    { unfold real. rewrite C1. rewrite <- (round_0 radix2 (SpecFloat.fexp 24 128) ZnearestE).
      apply round_le; auto with typeclass_instances. unfold real in Hle. lra. }
    split; [| split]; auto.
    + destruct (Bminus _ _ _ _ _ _ x m); try discriminate; reflexivity.
    + intros H. rewrite H in C2. discriminate.
  - destruct C as [C1 C2]. rewrite overflow_NE in C1.
    apply B2FF_inf in C1. rewrite C1.
    destruct (Bsign 24 128 x) eqn:Sx.
    + split; [reflexivity | split; [discriminate | unfold real; simpl; lra]].
    + exfalso. symmetry in C2. apply negb_false_iff in C2.
      pose proof (sign_false_pos x Fx Sx). pose proof (sign_true_neg m Fm C2).
      assert (Hz : (B2R 24 128 x - B2R 24 128 m = 0)%R) by (unfold real in *; lra).
      rewrite Hz, round_0, Rabs_R0, Rlt_bool_true in Hb by (apply bpow_gt_0 || auto with typeclass_instances).
      discriminate.
Qed.

Lemma sub_self : forall m, finite m -> sub m m = pos_zero.
Proof.
  intros m Fm.
  pose proof (Bminus_correct 24 128 eq_refl eq_refl binop_nan_pl32 BinarySingleNaN.mode_NE m m Fm Fm) as C.
  unfold sub, b32_minus. cbv zeta.
  rewrite Rminus_diag_eq, round_0, Rabs_R0, Rlt_bool_true in C
    by (apply bpow_gt_0 || reflexivity || auto with typeclass_instances).
  destruct C as [C1 [C2 C3]]. rewrite Rcompare_Eq in C3 by reflexivity.
  apply B2R_Bsign_inj; auto. rewrite C3. simpl. now destruct (Bsign 24 128 m).
Qed.

(* ---- The sum is at least 1. *)
Definition nonneg (e : f32) : Prop := finite e /\ sign e = false.
Definition nonneg_acc (s : f32) : Prop := s = pos_inf \/ nonneg s.
Definition at_least_one (s : f32) : Prop := s = pos_inf \/ (finite s /\ (1 <= real s)%R).

Lemma format_one : generic_format radix2 (SpecFloat.fexp 24 128) 1.
Proof. rewrite <- real_one. apply generic_format_B2R. Qed.

Lemma add_inf_nonneg : forall e, nonneg e -> add pos_inf e = pos_inf.
Proof. intros [s|s|s pl H|s m ee H] [Fe Se]; try discriminate; reflexivity. Qed.

(* Two finite non-negative floats: their sum is non-negative, and at least 1 if their real sum is. *)
Lemma add_nonneg_finite : forall s e, nonneg s -> nonneg e ->
  nonneg_acc (add s e) /\ ((1 <= real s + real e)%R -> at_least_one (add s e)).
Proof.
  intros s e [Fs Ss] [Fe Se].
  pose proof (sign_false_pos s Fs Ss). pose proof (sign_false_pos e Fe Se).
  pose proof (Bplus_correct 24 128 eq_refl eq_refl binop_nan_pl32 BinarySingleNaN.mode_NE s e Fs Fe) as C.
  unfold add, b32_plus. cbv zeta.
  destruct Rlt_bool.
  - destruct C as [C1 [C2 C3]]. split.
    + right. split; auto. unfold sign. rewrite C3. unfold sign in Ss, Se. rewrite Ss, Se.
      unfold real in *. case Rcompare_spec; intros; auto; lra.
    + intros H1. right. split; auto. unfold real. rewrite C1.
      rewrite <- (round_generic radix2 (SpecFloat.fexp 24 128) ZnearestE 1) by apply format_one.
      apply round_le; auto with typeclass_instances.
  - destruct C as [C1 _]. rewrite overflow_NE in C1. apply B2FF_inf in C1. rewrite C1.
    unfold sign in Ss. rewrite Ss. split; left; reflexivity.
Qed.

Lemma nonneg_real : forall s, nonneg_acc s -> s = pos_inf \/ (nonneg s /\ (0 <= real s)%R).
Proof. intros s [H | [Fs Ss]]; auto. right. split. split; auto. now apply sign_false_pos. Qed.

Lemma fold_exp_sum : forall es acc,
  nonneg_acc acc -> Forall nonneg es -> (at_least_one acc \/ In one es) ->
  at_least_one (fold_left add es acc).
Proof.
  induction es as [| e es IH]; intros acc Hacc Hes Hone; simpl.
  - destruct Hone as [H | []]. exact H.
  - inversion Hes as [| ? ? He Hes']. subst.
    destruct (nonneg_real acc Hacc) as [Hinf | [Hn Hr]].
    + subst acc. rewrite add_inf_nonneg by exact He.
      apply IH; unfold nonneg_acc, at_least_one; auto.
    + destruct (add_nonneg_finite acc e Hn He) as [Hn' H1]. apply IH; auto.
      destruct Hone as [[Hinf | [_ Ha]] | [He1 | Hin]]; auto.
      * subst acc. destruct Hn as [Hf _]. discriminate.
      * left. apply H1. pose proof (sign_false_pos e (proj1 He) (proj2 He)). lra.
      * left. apply H1. subst e. rewrite real_one. lra.
Qed.

Lemma div_zero_at_least_one : forall s, at_least_one s -> div pos_zero s = pos_zero.
Proof.
  intros s [Hs | [Fs Hs]].
  - subst s. reflexivity.
  - destruct s as [ss|ss|ss pl H|ss m e H]; try discriminate; unfold real in Hs; simpl in Hs; try lra.
    destruct ss; [| reflexivity].
    exfalso. simpl in Hs. assert (F2R (Float radix2 (Zneg m) e) < 0)%R by (apply F2R_lt_0; simpl; lia). lra.
Qed.

Lemma repeat_zeros : forall k, Forall is_zero (repeat pos_zero k).
Proof. induction k; simpl; constructor; auto. left; reflexivity. Qed.

Lemma map_repeat : forall (A B : Type) (f : A -> B) x k, map f (repeat x k) = repeat (f x) k.
Proof. induction k; simpl; congruence. Qed.

Lemma row_max_finite : forall x0 rest, Forall finite (x0 :: rest) -> finite (row_max x0 rest).
Proof. intros x0 rest Hf. rewrite Forall_forall in Hf. apply Hf, row_max_in. Qed.

(* The masked row's exponentials: the prefix's, then exact +0s. *)
Lemma shifted_exps_masked : forall exp x0 rest k,
  exp_of_neg_inf_is_zero exp -> Forall finite (x0 :: rest) ->
  shifted_exps exp (x0 :: rest ++ repeat neg_inf k) = shifted_exps exp (x0 :: rest) ++ repeat pos_zero k.
Proof.
  intros exp x0 rest k Hinf Hf. unfold shifted_exps.
  rewrite row_max_masked, app_comm_cons, map_app, map_repeat, sub_neg_inf by (now apply row_max_finite).
  now rewrite Hinf.
Qed.

(* The sum over the masked row is the sum over the prefix, bit for bit. *)
Theorem exp_sum_masked : forall exp x0 rest k,
  exp_of_neg_inf_is_zero exp -> Forall finite (x0 :: rest) ->
  exp_sum exp (x0 :: rest ++ repeat neg_inf k) = exp_sum exp (x0 :: rest).
Proof.
  intros exp x0 rest k Hinf Hf. unfold exp_sum.
  rewrite shifted_exps_masked, fold_left_app by assumption.
  apply fold_add_zeros; [apply fold_add_not_neg_zero; discriminate | apply repeat_zeros].
Qed.

(* ... and it is at least 1: the maximum contributes exp(+0) = 1, the rest are non-negative. So
   the masked entries' +0 / sum are +0, never 0 / 0. *)
Theorem exp_sum_at_least_one : forall exp x0 rest,
  exp_of_zero_is_one exp -> exp_nonpositive_is_nonnegative exp -> Forall finite (x0 :: rest) ->
  at_least_one (exp_sum exp (x0 :: rest)).
Proof.
  intros exp x0 rest Hzero Hnonneg Hf. unfold exp_sum, shifted_exps.
  set (m := row_max x0 rest).
  assert (Fm : finite m) by (now apply row_max_finite).
  apply fold_exp_sum.
  - right. split; reflexivity.
  - apply Forall_forall. intros e He. apply in_map_iff in He. destruct He as [x [<- Hx]].
    assert (Fx : finite x) by (rewrite Forall_forall in Hf; auto).
    destruct (sub_nonpositive x m Fx Fm (row_max_ge rest x0 Hf x Hx)) as [H1 [H2 H3]].
    apply Hnonneg; auto.
  - right. apply in_map_iff. exists m. split.
    + rewrite sub_self by exact Fm. exact Hzero.
    + apply row_max_in.
Qed.

(* The softmax of a masked row is the softmax of its prefix followed by exact +0s. *)
Theorem softmax_masked : forall exp x0 rest k,
  exp_of_neg_inf_is_zero exp -> exp_of_zero_is_one exp -> exp_nonpositive_is_nonnegative exp ->
  Forall finite (x0 :: rest) ->
  softmax exp (x0 :: rest ++ repeat neg_inf k) = softmax exp (x0 :: rest) ++ repeat pos_zero k.
Proof.
  intros exp x0 rest k Hinf Hzero Hnonneg Hf. unfold softmax.
  rewrite exp_sum_masked, shifted_exps_masked, map_app, map_repeat by assumption.
  rewrite div_zero_at_least_one by (now apply exp_sum_at_least_one). reflexivity.
Qed.

(* ---- One attention row, as kernels.cpp computes it (attention_row) and as naive decode does
   (CpuBackend::causal_attention: scores for every column, masked columns set to -inf, a softmax
   over the whole row, then P V over every row). *)

(* q . k = ((+0 + q0 k0) + q1 k1) + ..., d ascending (attention_row; matmul of Q by K^T). *)
Definition dot (q k : list f32) : f32 := fold_left mac (combine q k) pos_zero.
Definition scores (scale : f32) (q : list f32) (keys : list (list f32)) : list f32 :=
  map (fun k => div (dot q k) scale) keys.
(* Output d: ((+0 + p0 v0[d]) + p1 v1[d]) + ..., t ascending (attention_row; matmul of P by V). *)
Definition weighted_sum (ps : list f32) (vals : list (list f32)) (d : nat) : f32 :=
  fold_left mac (combine ps (map (fun v => nth d v pos_zero) vals)) pos_zero.

Section AttentionRow.
  Variables (exp : f32 -> f32) (scale : f32) (head_size : nat).

  (* Cached decode: the row reads the K and V rows of positions 0..t, and nothing else. *)
  Definition attention_row (q : list f32) (keys vals : list (list f32)) : list f32 :=
    map (weighted_sum (softmax exp (scores scale q keys)) vals) (seq 0 head_size).

  (* Naive decode, row t of T = length keys: every column scored, columns past t set to -inf. *)
  Definition causal_row (q : list f32) (keys vals : list (list f32)) (t : nat) : list f32 :=
    let s := firstn (S t) (scores scale q keys) ++ repeat neg_inf (length keys - S t) in
    map (weighted_sum (softmax exp s) vals) (seq 0 head_size).
End AttentionRow.

Lemma combine_app : forall (A B : Type) (l1 l2 : list A) (m1 m2 : list B),
  length l1 = length m1 -> combine (l1 ++ l2) (m1 ++ m2) = combine l1 m1 ++ combine l2 m2.
Proof.
  induction l1 as [| a l1 IH]; intros l2 [| b m1] m2 H; simpl in *; try discriminate; auto.
  rewrite IH by lia. reflexivity.
Qed.

Lemma combine_repeat : forall (A B : Type) (z : A) (ws : list B),
  combine (repeat z (length ws)) ws = map (pair z) ws.
Proof. induction ws; simpl; congruence. Qed.

Lemma softmax_length : forall exp xs, length (softmax exp xs) = length xs.
Proof. intros exp [| x0 rest]; unfold softmax, shifted_exps; simpl; auto. now rewrite !map_length. Qed.

(* The theorem of this part: naive decode's masked row t is the cached row over positions
   0..t, bit for bit, when the row's scores over 0..t and the V rows past t are finite. *)
Theorem causal_row_is_cached_row : forall exp scale head_size q keys vals t,
  exp_of_neg_inf_is_zero exp -> exp_of_zero_is_one exp -> exp_nonpositive_is_nonnegative exp ->
  S t <= length keys -> length vals = length keys ->
  Forall finite (firstn (S t) (scores scale q keys)) ->
  Forall (Forall finite) (skipn (S t) vals) ->
  causal_row exp scale head_size q keys vals t =
    attention_row exp scale head_size q (firstn (S t) keys) (firstn (S t) vals).
Proof.
  intros exp scale head_size q keys vals t Hinf Hzero Hnonneg Ht Hlen Hs Hv.
  unfold causal_row, attention_row. apply map_ext. intros d.
  unfold scores at 2. rewrite <- firstn_map. fold (scores scale q keys).
  assert (Hl : length (firstn (S t) (scores scale q keys)) = S t)
    by (unfold scores; rewrite firstn_length, map_length; lia).
  destruct (firstn (S t) (scores scale q keys)) as [| x0 rest] eqn:E; [discriminate |].
  rewrite <- app_comm_cons, softmax_masked by assumption.
  unfold weighted_sum. rewrite <- (firstn_skipn (S t) vals) at 1.
  rewrite map_app, combine_app.
  2: { rewrite softmax_length, map_length, firstn_length. lia. }
  replace (length keys - S t) with (length (map (fun v => nth d v pos_zero) (skipn (S t) vals)))
    by (rewrite map_length, skipn_length; lia).
  rewrite combine_repeat. apply masked_fold.
  apply Forall_map. revert Hv. apply Forall_impl. intros v Hvf.
  destruct (Nat.lt_ge_cases d (length v)) as [Hd | Hd].
  - rewrite Forall_forall in Hvf. apply Hvf, nth_In, Hd.
  - rewrite nth_overflow by exact Hd. reflexivity.
Qed.

Lemma Forall_skipn : forall (A : Type) (P : A -> Prop) n l, Forall P l -> Forall P (skipn n l).
Proof. induction n; intros [| a l] H; simpl; auto. inversion H; auto. Qed.

(* ---- Combined with causal reuse: a float32 decoder stack. *)

Section Float32Decoder.
  Notation Rows := (list (list f32)).
  Variables (Tok X : Type) (embed : Tok -> X).
  (* Layer l's per-head queries [n_heads][head_size] and per-KV-head K and V rows
     [n_kv_heads][head_size] of a row at position t, and its row-wise work after attention. *)
  Variable qkv : nat -> nat -> X -> Rows * (Rows * Rows).
  Variable post : nat -> X -> Rows -> X.
  Variables (exp : f32 -> f32) (scale : f32) (n_heads head_size : nat) (kv_head : nat -> nat).

  Definition head_keys (h : nat) (kvs : list (Rows * Rows)) : Rows :=
    map (fun kv => nth (kv_head h) (fst kv) []) kvs.
  Definition head_values (h : nat) (kvs : list (Rows * Rows)) : Rows :=
    map (fun kv => nth (kv_head h) (snd kv) []) kvs.

  (* Cached decode: every head attends over the rows it is given, in the kernel's order. *)
  Definition attend (q : Rows) (kvs : list (Rows * Rows)) : Rows :=
    map (fun h => attention_row exp scale head_size (nth h q []) (head_keys h kvs) (head_values h kvs))
      (seq 0 n_heads).

  (* Naive decode: the row at position t scores every row of the sequence and masks the later ones. *)
  Definition attend_masked (q : Rows) (t : nat) (all : list (Rows * Rows)) : Rows :=
    map (fun h => causal_row exp scale head_size (nth h q []) (head_keys h all) (head_values h all) t)
      (seq 0 n_heads).

  Fixpoint layer_rows_masked (l t : nat) (all : list (Rows * Rows)) (xs : list X) : list X :=
    match xs with
    | [] => []
    | x :: r => post l x (attend_masked (q_of X Rows Rows Rows qkv l t x) t all)
                  :: layer_rows_masked l (S t) all r
    end.
  Definition layer_masked (l : nat) (xs : list X) : list X :=
    layer_rows_masked l 0 (kvs_from X Rows Rows Rows qkv l 0 xs) xs.
  (* Naive decode as the C++ runs it: every layer recomputes every row with masked attention. *)
  Fixpoint hidden_masked (n : nat) (xs : list X) : list X :=
    match n with
    | 0 => xs
    | S m => layer_masked m (hidden_masked m xs)
    end.

  (* The data hypothesis: what naive decode computes is finite (no score and no V entry
     overflowed to inf or became NaN). *)
  Definition values_finite (all : list (Rows * Rows)) : Prop :=
    Forall (fun kv => Forall (Forall finite) (snd kv)) all.
  Fixpoint scores_finite (l t : nat) (all : list (Rows * Rows)) (xs : list X) : Prop :=
    match xs with
    | [] => True
    | x :: r =>
        (forall h, In h (seq 0 n_heads) ->
           Forall finite (firstn (S t) (scores scale (nth h (q_of X Rows Rows Rows qkv l t x) []) (head_keys h all))))
        /\ scores_finite l (S t) all r
    end.
  Definition run_finite (n : nat) (xs : list X) : Prop :=
    forall l, l < n ->
      let ys := hidden X Rows Rows Rows Rows qkv post attend l xs in
      let all := kvs_from X Rows Rows Rows qkv l 0 ys in
      values_finite all /\ scores_finite l 0 all ys.

  Hypotheses (Hinf : exp_of_neg_inf_is_zero exp) (Hzero : exp_of_zero_is_one exp)
             (Hnonneg : exp_nonpositive_is_nonnegative exp).

  Lemma attend_masked_is_attend : forall q t all,
    S t <= length all -> values_finite all ->
    (forall h, In h (seq 0 n_heads) -> Forall finite (firstn (S t) (scores scale (nth h q []) (head_keys h all)))) ->
    attend_masked q t all = attend q (firstn (S t) all).
  Proof.
    intros q t all Ht Hv Hs. unfold attend_masked, attend. apply map_ext_in. intros h Hh.
    unfold head_keys, head_values. rewrite <- !firstn_map.
    apply causal_row_is_cached_row; auto; rewrite ?map_length; auto.
    { apply Hs, Hh. }
    apply Forall_skipn. apply Forall_map. revert Hv. apply Forall_impl.
    intros kv Hkv. destruct (Nat.lt_ge_cases (kv_head h) (length (snd kv))) as [Hd | Hd].
    - rewrite Forall_forall in Hkv. apply Hkv, nth_In, Hd.
    - rewrite nth_overflow by exact Hd. constructor.
  Qed.

  Lemma layer_rows_masked_is_naive : forall l xs t all,
    t + length xs <= length all -> values_finite all -> scores_finite l t all xs ->
    layer_rows_masked l t all xs = layer_rows X Rows Rows Rows Rows qkv post attend l t all xs.
  Proof.
    induction xs as [| x xs IH]; intros t all Ht Hv Hs; simpl in *; auto.
    destruct Hs as [Hs0 Hs]. rewrite attend_masked_is_attend by (auto; lia).
    rewrite IH by (auto; lia). reflexivity.
  Qed.

  Lemma hidden_masked_is_naive : forall n xs, run_finite n xs ->
    hidden_masked n xs = hidden X Rows Rows Rows Rows qkv post attend n xs.
  Proof.
    induction n as [| n IH]; intros xs Hrun; simpl; auto.
    rewrite IH by (intros l Hl; apply Hrun; lia).
    destruct (Hrun n (Nat.lt_succ_diag_r n)) as [Hv Hs].
    unfold layer_masked, layer_naive. apply layer_rows_masked_is_naive; auto.
    rewrite kvs_from_length. lia.
  Qed.

  (* The claim kvlab demo prints, proven for float32: naive decode's last row (masked attention
     over the whole sequence, as the C++ computes it) equals cached decode's row, bit for bit,
     given exp_f32's three tested properties and a run whose scores and V rows are finite. *)
  Theorem naive_equals_cached_f32 : forall n toks tok,
    run_finite n (map embed (toks ++ [tok])) ->
    last (hidden_masked n (map embed (toks ++ [tok]))) (embed tok) =
      cached_row X Rows Rows Rows Rows qkv post attend n
        (cache_of X Rows Rows Rows Rows qkv post attend (map embed toks)) (length toks) (embed tok).
  Proof.
    intros n toks tok Hrun. rewrite hidden_masked_is_naive by exact Hrun.
    apply cached_row_equals_naive. intros q kvs. reflexivity.
  Qed.
End Float32Decoder.
