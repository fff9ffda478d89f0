"""What the grader says about a failing case: a few sentences on the most likely mistake, in English
or Chinese (``i18n.T``). ``diagnose`` reads the outputs of the first failing case (and the pattern of
which cases pass); the unit checks call the student's functions on tiny hand-computed examples (they
run in the child process, like all student code)."""
from __future__ import annotations

import math

import numpy as np

from i18n import T

# words that differ between the labs, for the hints
WORDS = {
    "lab1": dict(exp="np.exp", fix_neginf="m_safe = np.where(np.isneginf(m_new), 0.0, m_new) and subtract m_safe",
                 merge="merge_block", final="finalize", alpha="alpha = np.exp(m_old - m_new)"),
    "lab2": dict(exp="tl.exp2", fix_neginf='m_safe = tl.where(m_new == float("-inf"), 0.0, m_new) and subtract m_safe',
                 merge="the loop body", final="the epilogue", alpha="alpha = tl.exp2(m_i - m_new)"),
    "lab3": dict(exp="exp2f", fix_neginf="use fa::exp2_minus(x, m), which is 0 when m = -inf",
                 merge="merge_block_stats", final="normalize_output",
                 alpha="a = fa::exp2_minus(m_i, m_new) (and the tile's l_ij by b = fa::exp2_minus(m_ij, m_new))"),
}
ACC_RULE = {"lab1": "acc = alpha[..., None] * acc + P_ij @ V_j",
            "lab2": "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)",
            "lab3": "acc = a * acc + b * pv, for every column the lane owns"}


def rows_text(rows, n=6) -> str:
    rows = [int(i) for i in rows]
    return ", ".join(map(str, rows[:n])) + (", ..." if len(rows) > n else "")


def diagnose(lab, r, results, block_n) -> list:
    """A few sentences about what is most likely wrong in the first failing forward case ``r``."""
    w = WORDS[lab]
    Nq, Nk = r.case["Nq"], r.case["Nk"]
    if r.error:
        return [T("your code failed: {e}", "你的代码出错：{e}", e=r.error),
                T("Fix that first (run the lab file's function by hand on small inputs).",
                  "先修好它（在小输入上手动运行实验文件里的函数）。")]
    o, lse = r.out["o"], r.out["lse"]
    o_ref, lse_ref = r.ref["o"], r.ref["lse"]
    if o.shape != o_ref.shape or lse.shape != lse_ref.shape:
        return [T("shapes: O {a} (expected {b}), lse {c} (expected {d}).", "形状：O 为 {a}（应为 {b}），lse 为 {c}（应为 {d}）。",
                  a=o.shape, b=o_ref.shape, c=lse.shape, d=lse_ref.shape)]
    several = lambda x: x.case["Nk"] > block_n  # noqa: E731
    hints = []
    nan_rows = np.isnan(o).any(axis=-1) | np.isnan(lse)
    no_key = np.zeros(Nq, bool)
    if r.causal:
        no_key = np.arange(Nq) + Nk - Nq < 0  # query i sees key j iff j <= i + Nk - Nq
    if nan_rows.any():
        rows = np.unique(np.nonzero(nan_rows)[-1])
        if r.causal and no_key.any() and no_key[rows].all():
            hints += [T("NaN in rows {rows}: exactly the rows that see no key at all (causal with Nq = {Nq} > Nk = {Nk}).",
                        "第 {rows} 行是 NaN：正好是一个 key 都看不到的行（causal，且 Nq = {Nq} > Nk = {Nk}）。",
                        rows=rows_text(rows), Nq=Nq, Nk=Nk),
                      T("Every score of such a row is -inf, so m_new = -inf and exp(S - m_new) = exp(-inf - (-inf)) = NaN.",
                        "这样的行所有分数都是 -inf，于是 m_new = -inf，exp(S - m_new) = exp(-inf - (-inf)) = NaN。"),
                      T("Fix in {merge}: {fix};", "在 {merge} 中修正：{fix}；", merge=w["merge"], fix=w["fix_neginf"]),
                      T("and in {final}: where l == 0 give O = 0 and lse = -inf instead of dividing by 0.",
                        "并在 {final} 中：l == 0 的行令 O = 0、lse = -inf，不要除以 0。", final=w["final"])]
        elif r.causal:
            hints += [T("NaN in rows {rows}, only with the causal mask: some row has every key of a block hidden,",
                        "第 {rows} 行是 NaN，且只在 causal 掩码下出现：某一行在某个块里所有 key 都被遮住，", rows=rows_text(rows)),
                      T("so its m is still -inf and exp(-inf - (-inf)) = NaN. Fix: {fix}.",
                        "它的 m 仍是 -inf，exp(-inf - (-inf)) = NaN。修正：{fix}。", fix=w["fix_neginf"])]
        else:
            hints += [T("NaN in rows {rows} without any mask: look for 0/0 or inf - inf.",
                        "没有掩码时第 {rows} 行出现 NaN：找找 0/0 或 inf - inf。", rows=rows_text(rows)),
                      T("Did you subtract the running max before {exp}? (exp of a large score overflows to inf)",
                        "在 {exp} 之前减去运行最大值了吗？（大分数的 exp 会溢出成 inf）", exp=w["exp"])]
        return hints
    lse_inf_wrong = ~np.equal(np.isinf(lse), np.isinf(lse_ref)) | (np.isinf(lse_ref) & (lse != lse_ref))
    if lse_inf_wrong.any():
        rows = np.unique(np.nonzero(lse_inf_wrong)[-1])
        if np.isinf(lse_ref[..., rows]).all():
            hints += [T("rows {rows} see no key (causal, Nq > Nk): they must get lse = -inf and O = 0.",
                        "第 {rows} 行看不到任何 key（causal，Nq > Nk）：它们应得到 lse = -inf、O = 0。", rows=rows_text(rows)),
                      T("In {final}, detect them with l == 0.", "在 {final} 中用 l == 0 判断这些行。", final=w["final"])]
        else:
            hints += [T("lse is infinite in rows {rows} that do see keys: is l = 0 there (the keys were never added)",
                        "第 {rows} 行能看到 key，lse 却是无穷：那里 l = 0 吗（key 从没加进来）？", rows=rows_text(rows)),
                      T("or did {exp} overflow (subtract the max first)?", "还是 {exp} 溢出了（先减去最大值）？", exp=w["exp"])]
        return hints
    if not r.ok.get("lse", True):
        finite = np.isfinite(lse_ref)
        d = (lse - lse_ref)[finite]
        bias = float(d[np.argmax(np.abs(d))]) if d.size else 0.0  # the sign of the worst row's error
        if several(r):
            if bias > 0:
                hints += [T("the row sums l look too large (lse is above the reference): did you rescale l by",
                            "行和 l 看起来偏大（lse 高于参考值）：加上 rowsum(P_ij) 之前，"),
                          T("{alpha} before adding rowsum(P_ij)? Without it, blocks summed under an old, smaller max count too much.",
                            "你用 {alpha} 重新缩放 l 了吗？不缩放的话，在旧的、较小的最大值下求和的块被算多了。", alpha=w["alpha"])]
            else:
                hints += [T("the row sums l look too small (lse is below the reference): is alpha the right way round,",
                            "行和 l 看起来偏小（lse 低于参考值）：alpha 的方向对吗，"),
                          T("{alpha} (<= 1)? And does P_ij = {exp}(S_ij - m_new) use the NEW max?",
                            "{alpha}（<= 1）？P_ij = {exp}(S_ij - m_new) 用的是新的最大值吗？", alpha=w["alpha"], exp=w["exp"])]
        else:
            hints += [T("this case has a single K/V block (Nk = {Nk} <= BLOCK_N = {bn}), so no merging is involved:",
                        "这个用例只有一个 K/V 块（Nk = {Nk} <= BLOCK_N = {bn}），不涉及合并：", Nk=Nk, bn=block_n),
                      T("check l = rowsum({exp}(S_ij - m_new)) (sum over the keys, the last axis) and lse = m + log(l).",
                        "检查 l = rowsum({exp}(S_ij - m_new))（对 key 求和，即最后一维）以及 lse = m + log(l)。", exp=w["exp"])]
            if lab == "lab2":
                hints += [T("Base 2: qk_scale already contains log2(e); use tl.exp2 on the scaled scores, not tl.exp.",
                            "以 2 为底：qk_scale 已经包含 log2(e)；对缩放后的分数用 tl.exp2，不要用 tl.exp。")]
    elif not r.ok.get("o", True):
        if several(r):
            hints += [T("m and l are right (lse matches the reference) but O is not. acc must be rescaled exactly like l:",
                        "m 和 l 是对的（lse 与参考值一致），但 O 不对。acc 必须和 l 完全一样地重新缩放："),
                      T("{rule}, and O = acc / l once at the end ({final}).", "{rule}，最后（{final}）只做一次 O = acc / l。",
                        rule=ACC_RULE[lab], final=w["final"])]
        else:
            hints += [T("m and l are right (lse matches the reference) but O is not, with a single K/V block:",
                        "m 和 l 是对的（lse 与参考值一致），但只有一个 K/V 块时 O 仍不对："),
                      T("check acc += P_ij @ V_j (probabilities times values) and O = acc / l.",
                        "检查 acc += P_ij @ V_j（概率乘以 value）以及 O = acc / l。")]
    graded = [x for x in results if x.status in ("PASS", "FAIL", "ERROR")]
    one_fail = [x for x in graded if x.status != "PASS" and not several(x)]
    several_pass = [x for x in graded if x.status == "PASS" and several(x)]
    single_pass = [x for x in graded if x.status == "PASS" and not several(x)]
    if single_pass and not one_fail and not several_pass:
        hints.append(T("Pattern: every case with one K/V block passes, every case with several fails: the merge across blocks is the problem.",
                       "规律：只有一个 K/V 块的用例全部通过，有多个块的全部失败：问题出在块之间的合并。"))
    if r.causal and all(x.status == "PASS" for x in graded if not x.causal):
        hints.append(T("Pattern: every non-causal case passes: look at how you treat masked (-inf) scores.",
                       "规律：所有非 causal 用例都通过：看看你怎样处理被遮住（-inf）的分数。"))
    if not hints:
        err = np.abs(o - o_ref).max(axis=-1)
        idx = np.unravel_index(int(np.argmax(err)), err.shape)
        hints.append(T("the largest error of O is in query row {i} (of Nq = {Nq}); compare that row by hand.",
                       "O 的最大误差在第 {i} 行（共 Nq = {Nq} 行）；手算对比这一行。", i=idx[-1], Nq=Nq))
    return hints


def diagnose_lab4(r, results) -> list:
    """Lab 4 (the backward): which of dQ, dK, dV is off says which line of the inner step to look at."""
    if r.error:
        return [T("your code failed: {e}", "你的代码出错：{e}", e=r.error),
                T("Fix that first (call backward_block by hand on small inputs).", "先修好它（在小输入上手动调用 backward_block）。")]
    bad = [q for q in ("dq", "dk", "dv") if not r.ok.get(q, True)]
    nan = [q for q in ("dq", "dk", "dv") if np.isnan(r.out[q]).any()]
    if nan:
        if r.causal and r.case["Nq"] > r.case["Nk"]:
            return [T("NaN in {q}: this causal case has rows that see no key (Nq = {Nq} > Nk = {Nk}); their lse is -inf,",
                      "{q} 中有 NaN：这个 causal 用例有看不到任何 key 的行（Nq = {Nq} > Nk = {Nk}）；它们的 lse 是 -inf，",
                      q=", ".join(nan), Nq=r.case["Nq"], Nk=r.case["Nk"]),
                    T("so P_ij = exp(S_ij - lse_i) = exp(-inf - (-inf)) = NaN. Subtract 0 where lse_i is -inf: "
                      "lse_safe = np.where(np.isneginf(lse_i), 0.0, lse_i).",
                      "所以 P_ij = exp(S_ij - lse_i) = exp(-inf - (-inf)) = NaN。lse_i 为 -inf 时减 0："
                      "lse_safe = np.where(np.isneginf(lse_i), 0.0, lse_i)。")]
        return [T("NaN in {q}: look for -inf - (-inf) or 0 * inf (is a masked S_ij = -inf multiplied by something?).",
                  "{q} 中有 NaN：找找 -inf - (-inf) 或 0 * inf（被遮住的 S_ij = -inf 是否被乘了？）。", q=", ".join(nan))]
    hints = []
    if "dv" in bad:
        hints += [T("dV is wrong, and dV_j += P_ij^T @ dO_i needs only P_ij: recompute P_ij = exp(S_ij - lse_i) with "
                    "S_ij = scale * Q_i @ K_j^T (-inf where hidden), and transpose P_ij (np.swapaxes(P_ij, -1, -2)).",
                    "dV 不对，而 dV_j += P_ij^T @ dO_i 只用到 P_ij：用 S_ij = scale * Q_i @ K_j^T（被遮住处为 -inf）"
                    "重算 P_ij = exp(S_ij - lse_i)，并转置 P_ij（np.swapaxes(P_ij, -1, -2)）。")]
    elif "dq" in bad and "dk" in bad:
        hints += [T("dV is right (so P_ij is), dQ and dK are not: check dP_ij = dO_i @ V_j^T and dS_ij = P_ij * (dP_ij - D_i) "
                    "with D_i = rowsum(dO_i * O_i) (preprocess) broadcast as D_i[..., None].",
                    "dV 是对的（说明 P_ij 对），dQ 和 dK 不对：检查 dP_ij = dO_i @ V_j^T 以及 dS_ij = P_ij * (dP_ij - D_i)，"
                    "其中 D_i = rowsum(dO_i * O_i)（preprocess），按 D_i[..., None] 广播。"),
                  T("Both dQ and dK carry the factor scale: dQ_i += scale * dS_ij @ K_j, dK_j += scale * dS_ij^T @ Q_i.",
                    "dQ 和 dK 都要乘 scale：dQ_i += scale * dS_ij @ K_j，dK_j += scale * dS_ij^T @ Q_i。")]
    elif "dq" in bad:
        hints += [T("only dQ is wrong: dQ_i += scale * dS_ij @ K_j (and return the updated dQ_i: the loop writes it back).",
                    "只有 dQ 不对：dQ_i += scale * dS_ij @ K_j（并返回更新后的 dQ_i：循环会把它写回）。")]
    elif "dk" in bad:
        hints += [T("only dK is wrong: dK_j += scale * dS_ij^T @ Q_i (the transpose of dS_ij, times Q_i).",
                    "只有 dK 不对：dK_j += scale * dS_ij^T @ Q_i（dS_ij 的转置乘以 Q_i）。")]
    if r.causal and all(x.status == "PASS" for x in results if not x.causal and x.status in ("PASS", "FAIL")):
        hints.append(T("Pattern: every non-causal case passes: apply visible to S_ij (np.where(visible, S_ij, -np.inf)) "
                       "before the exponential.",
                       "规律：所有非 causal 用例都通过：在取指数之前把 visible 用到 S_ij 上（np.where(visible, S_ij, -np.inf)）。"))
    return hints


# ------------------------------------------------------------------------------------------ unit checks (child)
def lab1_unit_checks(mod) -> list:
    """Call merge_block and finalize on a 1-row example and say which of m, l, acc, O, lse is off."""
    e = math.e
    out = [T("Unit check on a one-row example (two blocks; the second has the larger max):",
             "单行小例子上的单元检查（两个块，第二个块的最大值更大）：")]
    m0, l0, a0 = np.array([-np.inf]), np.array([0.0]), np.zeros((1, 2))
    S1, V1 = np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [0.0, 1.0]])
    S2, V2 = np.array([[4.0, 0.0]]), np.array([[2.0, 0.0], [0.0, 3.0]])
    m1, l1, a1 = 2.0, e ** -1 + 1.0, np.array([e ** -1, 1.0])
    m2 = 4.0
    alpha = e ** (m1 - m2)
    l2 = alpha * l1 + 1.0 + e ** -4
    a2 = alpha * a1 + np.array([2.0, 3.0 * e ** -4])
    try:
        got1 = mod.merge_block(m0, l0, a0, S1, V1)
        got2 = mod.merge_block(*(np.asarray(g, dtype=np.float64) for g in got1), S2, V2)
        gm, gl, ga = (np.asarray(g, dtype=np.float64) for g in got2)
        gm1, gl1, ga1 = (np.asarray(g, dtype=np.float64) for g in got1)
    except NotImplementedError:
        return out + [T("  merge_block still raises NotImplementedError.", "  merge_block 仍然抛出 NotImplementedError。")]
    except Exception as exc:
        return out + [T("  merge_block raised {t}: {e}", "  merge_block 抛出 {t}：{e}", t=type(exc).__name__, e=exc)]
    ok = True
    if not np.allclose(gm1, [m1]) or not np.allclose(gm, [m2]):
        ok = False
        out.append(T("  m: got {a} then {b}, expected [{m1}] then [{m2}]: m_new = max(m_old, rowmax(S_ij)).",
                     "  m：得到 {a}，然后 {b}，应为 [{m1}]，然后 [{m2}]：m_new = max(m_old, rowmax(S_ij))。",
                     a=gm1.ravel(), b=gm.ravel(), m1=m1, m2=m2))
    if np.isnan(gl1).any():
        ok = False
        out.append(T("  l after block 1 is NaN. On the first block m_old = -inf, so alpha = exp(m_old - m_new) = 0 and "
                     "alpha * l_old = 0;\n    NaN means inf * 0 or -inf - (-inf): is alpha upside down (exp(m_new - m_old) = inf)?",
                     "  第 1 块之后 l 是 NaN。第一个块时 m_old = -inf，所以 alpha = exp(m_old - m_new) = 0，"
                     "alpha * l_old = 0；\n    NaN 意味着 inf * 0 或 -inf - (-inf)：alpha 是不是写反了（exp(m_new - m_old) = inf）？"))
    elif not np.allclose(gl1, [l1]):
        ok = False
        out.append(T("  l after block 1: got {g}, expected [{w:.6f}] = exp(1-2) + exp(2-2): P_ij = exp(S_ij - m_new), l = rowsum(P_ij).",
                     "  第 1 块之后的 l：得到 {g}，应为 [{w:.6f}] = exp(1-2) + exp(2-2)：P_ij = exp(S_ij - m_new)，l = rowsum(P_ij)。",
                     g=gl1.ravel(), w=l1))
    elif not np.allclose(gl, [l2]):
        ok = False
        guess = {l1 + 1.0 + e ** -4: T("l was not rescaled: l_new = alpha * l_old + rowsum(P_ij), alpha = exp(m_old - m_new)",
                                       "l 没有重新缩放：l_new = alpha * l_old + rowsum(P_ij)，alpha = exp(m_old - m_new)"),
                 e ** (m2 - m1) * l1 + 1.0 + e ** -4: T("alpha is upside down: alpha = exp(m_old - m_new), not exp(m_new - m_old)",
                                                        "alpha 写反了：alpha = exp(m_old - m_new)，不是 exp(m_new - m_old)"),
                 alpha * l1 + e ** 4 + 1.0: T("P_ij must subtract the new max: P_ij = exp(S_ij - m_new)",
                                              "P_ij 必须减去新的最大值：P_ij = exp(S_ij - m_new)")}
        why = next((v for k, v in guess.items() if np.isclose(gl[0], k)),
                   T("compare with l_new = alpha * l_old + rowsum(P_ij)", "对照 l_new = alpha * l_old + rowsum(P_ij)"))
        out.append(T("  l after block 2: got {g}, expected [{w:.6f}]: {why}.", "  第 2 块之后的 l：得到 {g}，应为 [{w:.6f}]：{why}。",
                     g=gl.ravel(), w=l2, why=why))
    if ok and not np.allclose(ga1, a1[None]):
        ok = False
        out.append(T("  acc after block 1: got {g}, expected {w}: acc_new = alpha * acc_old + P_ij @ V_j.",
                     "  第 1 块之后的 acc：得到 {g}，应为 {w}：acc_new = alpha * acc_old + P_ij @ V_j。", g=ga1.ravel(), w=a1))
    elif ok and not np.allclose(ga, a2[None]):
        ok = False
        why = (T("acc was not rescaled by alpha", "acc 没有乘 alpha 重新缩放") if np.allclose(ga, a1 + np.array([2.0, 3.0 * e ** -4]))
               else "acc_new = alpha[..., None] * acc_old + P_ij @ V_j")
        out.append(T("  acc after block 2: got {g}, expected {w}: {why}.", "  第 2 块之后的 acc：得到 {g}，应为 {w}：{why}。",
                     g=ga.ravel(), w=a2, why=why))
    with np.errstate(all="ignore"):
        try:
            hm, hl, ha = (np.asarray(g, dtype=np.float64) for g in
                          mod.merge_block(m0, l0, a0, np.array([[-np.inf, -np.inf]]), V1))
            if np.isnan(hm).any() or np.isnan(hl).any() or np.isnan(ha).any():
                ok = False
                out.append(T("  a row whose keys are all hidden (S_ij = -inf, m_old = -inf) gives NaN: "
                             "exp(-inf - (-inf)) is NaN; subtract 0 where m_new is -inf.",
                             "  所有 key 都被遮住的行（S_ij = -inf，m_old = -inf）得到 NaN："
                             "exp(-inf - (-inf)) 是 NaN；m_new 为 -inf 时减 0。"))
        except Exception as exc:
            out.append(T("  merge_block raised {t} on a fully masked row: {e}", "  merge_block 在全被遮住的行上抛出 {t}：{e}",
                         t=type(exc).__name__, e=exc))
        try:
            O, lse = (np.asarray(g, dtype=np.float64) for g in
                      mod.finalize(np.array([1.0, -np.inf]), np.array([2.0, 0.0]), np.array([[2.0, 4.0], [0.0, 0.0]])))
            want_o, want_lse = np.array([[1.0, 2.0], [0.0, 0.0]]), np.array([1.0 + math.log(2.0), -np.inf])
            if not (not np.isnan(O).any() and np.allclose(O, want_o)):
                ok = False
                out.append(T("  finalize: O = {g}, expected {w} (O = acc / l; 0 where l == 0).",
                             "  finalize：O = {g}，应为 {w}（O = acc / l；l == 0 处为 0）。", g=O.tolist(), w=want_o.tolist()))
            if not (np.array_equal(np.isinf(lse), [False, True]) and np.isclose(lse[0], want_lse[0]) and lse[1] == -np.inf):
                ok = False
                out.append(T("  finalize: lse = {g}, expected {w} (lse = m + log(l); -inf where l == 0).",
                             "  finalize：lse = {g}，应为 {w}（lse = m + log(l)；l == 0 处为 -inf）。", g=lse.tolist(), w=want_lse.tolist()))
        except NotImplementedError:
            ok = False
            out.append(T("  finalize still raises NotImplementedError.", "  finalize 仍然抛出 NotImplementedError。"))
        except Exception as exc:
            ok = False
            out.append(T("  finalize raised {t}: {e}", "  finalize 抛出 {t}：{e}", t=type(exc).__name__, e=exc))
    if ok:
        out.append(T("  merge_block and finalize are right on it: look at broadcasting over the (B, H) axes and the Br, Bc axes.",
                     "  merge_block 和 finalize 在这个例子上是对的：检查在 (B, H) 维以及 Br、Bc 维上的广播。"))
    return out


def lab4_unit_checks(mod) -> list:
    """preprocess on a 1-row example, and backward_block on a one-query, one-key example."""
    out = [T("Unit check on tiny examples:", "小例子上的单元检查：")]
    try:
        Dg = np.asarray(mod.preprocess(np.array([[[[1.0, 2.0]]]]), np.array([[[[3.0, 4.0]]]])), dtype=np.float64)
        if Dg.shape != (1, 1, 1) or not np.allclose(Dg, 11.0):
            out.append(T("  preprocess(O=[1, 2], dO=[3, 4]) gave {g} (shape {s}), expected [11.] of shape (1, 1, 1): "
                         "D = (dO * O).sum(axis=-1).",
                         "  preprocess(O=[1, 2], dO=[3, 4]) 得到 {g}（形状 {s}），应为形状 (1, 1, 1) 的 [11.]："
                         "D = (dO * O).sum(axis=-1)。", g=Dg.ravel(), s=Dg.shape))
            return out
    except Exception as exc:
        return out + [T("  preprocess raised {t}: {e}", "  preprocess 抛出 {t}：{e}", t=type(exc).__name__, e=exc)]
    # one query, one key: P = 1, so dV = dO, dP = dO . v, dS = 1 * (dP - D) with D = dO . O = dO . v: dS = 0
    q = np.array([[[[1.0, 0.0]]]]); k = np.array([[[[0.5, 1.0]]]]); v = np.array([[[[2.0, 3.0]]]])
    do = np.array([[[[1.0, -1.0]]]]); lse = np.array([[[0.5]]]); Dv = np.array([[[-1.0]]])
    z = np.zeros((1, 1, 1, 2))
    try:
        dq, dk, dv = (np.asarray(g, dtype=np.float64) for g in
                      mod.backward_block(q, k, v, do, lse, Dv, z.copy(), z.copy(), z.copy(), 1.0, None))
    except Exception as exc:
        return out + [T("  backward_block raised {t}: {e}", "  backward_block 抛出 {t}：{e}", t=type(exc).__name__, e=exc)]
    if not np.allclose(dv, do):
        out.append(T("  one query and one key with lse = S (so P = 1): dV = {g}, expected dO = {w}: dV_j += P_ij^T @ dO_i "
                     "with P_ij = exp(S_ij - lse_i).",
                     "  一个 query、一个 key，且 lse = S（所以 P = 1）：dV = {g}，应为 dO = {w}：dV_j += P_ij^T @ dO_i，"
                     "其中 P_ij = exp(S_ij - lse_i)。", g=dv.ravel(), w=do.ravel()))
    elif not np.allclose(dq, z) or not np.allclose(dk, z):
        out.append(T("  one key only, so the softmax is constant and dQ = dK = 0; got dQ = {a}, dK = {b}: "
                     "dS_ij = P_ij * (dP_ij - D_i), dP_ij = dO_i @ V_j^T.",
                     "  只有一个 key，softmax 是常数，所以 dQ = dK = 0；得到 dQ = {a}、dK = {b}："
                     "dS_ij = P_ij * (dP_ij - D_i)，dP_ij = dO_i @ V_j^T。", a=dq.ravel(), b=dk.ravel()))
    else:
        out.append(T("  preprocess and backward_block are right on them: look at the scale factor, the causal mask "
                     "(visible) and broadcasting over (B, H).",
                     "  preprocess 和 backward_block 在这些例子上是对的：检查 scale 因子、causal 掩码（visible）"
                     "以及在 (B, H) 维上的广播。"))
    return out
